"""What a model's tokens cost: a table of list prices, a `--prices` file, and the lookup between them.

The installed Inspect's model database has no prices (its `ModelCost` is filled only by
`--model-cost-config`), so a small table of list prices ships here, overridable with `--prices`.
It lives in the gateway, the layer that meters every request, and the harness's cost bound reads it
from here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

from openrebench.api import LOCAL_MODEL
from openrebench.base import OpenRebenchError

from ._local import INSPECT_COMPLETIONS_MODEL, INSPECT_MODEL

# Providers that run the model on this machine (or a server the user runs): no per-token price.
LOCAL_PROVIDERS = {"hf", "vllm", "vllm-completions", "sglang", "ollama", "llama-cpp-python", "mockllm",
                   "none", "transformer_lens", "nnterp"}

PRICES_DATE = "2025-10"
# US$ per 1M tokens: the providers' list prices (standard tier, prompts under 200k tokens) as published
# in October 2025. They change; pass --prices FILE for current or negotiated ones.
LIST_PRICES: dict[str, dict[str, float]] = {
    "openai/gpt-5": {"input": 1.25, "output": 10.0},
    "openai/gpt-5-mini": {"input": 0.25, "output": 2.0},
    "openai/gpt-5-nano": {"input": 0.05, "output": 0.40},
    "openai/gpt-4.1": {"input": 2.0, "output": 8.0},
    "openai/gpt-4.1-mini": {"input": 0.40, "output": 1.60},
    "openai/gpt-4.1-nano": {"input": 0.10, "output": 0.40},
    "openai/gpt-4o": {"input": 2.50, "output": 10.0},
    "openai/gpt-4o-2024-05-13": {"input": 5.0, "output": 15.0},
    "openai/gpt-4o-mini": {"input": 0.15, "output": 0.60},
    "openai/o1": {"input": 15.0, "output": 60.0},
    "openai/o3": {"input": 2.0, "output": 8.0},
    "openai/o3-mini": {"input": 1.10, "output": 4.40},
    "openai/o4-mini": {"input": 1.10, "output": 4.40},
    "anthropic/claude-opus-4-1": {"input": 15.0, "output": 75.0},
    "anthropic/claude-opus-4-0": {"input": 15.0, "output": 75.0},
    "anthropic/claude-sonnet-4-5": {"input": 3.0, "output": 15.0},
    "anthropic/claude-sonnet-4-0": {"input": 3.0, "output": 15.0},
    "anthropic/claude-3-7-sonnet-latest": {"input": 3.0, "output": 15.0},
    "anthropic/claude-haiku-4-5": {"input": 1.0, "output": 5.0},
    "anthropic/claude-3-5-haiku-latest": {"input": 0.80, "output": 4.0},
    "google/gemini-2.5-pro": {"input": 1.25, "output": 10.0},
    "google/gemini-2.5-flash": {"input": 0.30, "output": 2.50},
}


def _undated(model: str) -> str:
    return re.sub(r"-(\d{8}|\d{4}-\d{2}-\d{2})$", "", model)


OFFLINE_MODELS = (LOCAL_MODEL, INSPECT_MODEL, INSPECT_COMPLETIONS_MODEL)
"""The offline default model's names: the `local` alias and its Inspect names (chat, completions)."""


def find_price(model: str, prices: Mapping[str, Mapping[str, float]] | None = None
               ) -> tuple[dict[str, float] | None, str]:
    """US$ per 1M input/output tokens and where they come from (None: unknown)."""
    if prices and model in prices:
        return dict(prices[model]), "from --prices"
    if model in OFFLINE_MODELS:  # it runs here: free but priced (real tokens at $0.00, not unknown)
        return {"input": 0.0, "output": 0.0}, "runs locally"
    provider = model.split("/", 1)[0]
    if provider in LOCAL_PROVIDERS:
        return {"input": 0.0, "output": 0.0}, "runs locally"
    try:
        from inspect_ai.model import get_model_info

        info = get_model_info(model)
        if info is not None and info.cost is not None:
            return {"input": info.cost.input, "output": info.cost.output}, "from Inspect's model data"
    except Exception:  # a lookup that has to create the provider may fail without its settings
        pass
    for name in (model, _undated(model)):
        if name in LIST_PRICES:
            return dict(LIST_PRICES[name]), f"list prices of {PRICES_DATE}, may be stale: --prices FILE"
    return None, "unknown"


def load_prices(path: Path) -> dict[str, dict[str, float]]:
    """Dollars per million tokens by Inspect model name: {"openai/gpt-4o": {"input": 2.5, "output": 10}}."""
    try:
        raw = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise OpenRebenchError(f"{path} does not exist") from None
    except ValueError as e:
        raise OpenRebenchError(f"{path}: not valid JSON ({str(e).splitlines()[0]})") from None

    def ok(v: object) -> bool:
        return isinstance(v, dict) and all(isinstance(x, int | float) for x in v.values())

    if not isinstance(raw, dict) or not all(ok(v) for v in raw.values()):
        raise OpenRebenchError(f"{path}: expected {{model: {{\"input\": $/1M, \"output\": $/1M}}}}")
    return {str(k): {str(a): float(b) for a, b in v.items()} for k, v in raw.items()}
