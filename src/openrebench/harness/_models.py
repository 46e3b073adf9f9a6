"""Real models: the client package each Inspect provider needs, a cost bound before a run, and the
offline default model.

Inspect checks a provider's client only when `eval` creates the model, with its own pip hint;
`check_client` names the openrebench extra that installs it, before any run is set up.
The prices come from the gateway's table (`openrebench.gateway`), overridable with `--prices`.

`--model local` is the offline default: Gemma 3 270M served by llama.cpp on this machine
(`openrebench.gateway.shared_local_server`), reached through Inspect's real OpenAI-compatible provider
(`openai-api/local/gemma-3-270m`), so a run needs no key and no network. It is a small base model: it
will not solve a task, but every part of an agent's path (tool calls, usage, limits, logs) is real.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openrebench.api import LOCAL_MODEL, OpenRebenchError
from openrebench.base import usable_cores
from openrebench.gateway import (
    LOCAL_INSPECT_MODEL,
    LOCAL_MODEL_NAME,
    find_price,
    load_prices,
    shared_local_server,
)
from openrebench.runs import get_environment

from ._limits import Limits, fmt_duration, fmt_tokens
from .agents import get_agent

# The client package of every Inspect provider that needs one we ship an extra for, with the lowest
# version the installed Inspect accepts (inspect_ai/model/_providers/providers.py).
_OPENAI = ("openai", "openai", "3.4.0", "the OpenAI client", "openai")
CLIENTS: dict[str, tuple[str, str, str, str, str]] = {  # provider: (module, package, min, label, extra)
    **{p: _OPENAI for p in (
        "openai", "openai-api", "openai-api-completions", "ollama", "vllm", "vllm-completions", "sglang",
        "llama-cpp-python", "together", "fireworks", "deepseek", "openrouter", "perplexity", "cloudflare",
        "moonshot", "meta", "litellm-proxy", "sambanova", "hf-inference-providers")},
    "anthropic": ("anthropic", "anthropic", "2.0.0", "the Anthropic client", "anthropic"),
    "google": ("google.genai", "google-genai", "1.69.0", "Google's genai client", "google"),
    # torch and transformers are core dependencies; Inspect's hf provider also wants accelerate.
    "hf": ("accelerate", "accelerate", "1.0.0", "Hugging Face accelerate", "hf"),
}

LOCAL_ALIAS = LOCAL_MODEL  # `--model local`: the same word as an environment role's offline default
LOCAL_MODELS = (LOCAL_INSPECT_MODEL, f"openai-api-completions/local/{LOCAL_MODEL_NAME}")
"""The offline model's Inspect names: chat (the agent's, with tools) and raw completions."""
LOCAL_CONTEXT = 4096  # tokens per request: the shared server's slot (gateway/_local.py)
# How the agent's eval starts the shared server when no one else has (a running one is reused as it is).
# Replies are capped at 160 tokens: the base model rarely stops by itself, and at llama.cpp's 1024 a
# reply took 34-85 s on the 2-core CPU (12-30 tokens/s while a test suite ran), longer than a 1-minute
# attempt; each of its turns is working time. Not lower than any tier's own cap on the offline model
# (rust_codecontests' mini: 160), since the environments' scorings share a running server and its cap.
# One thread on a 2-core machine: under that load the 270M model generated 30 tokens/s on one thread
# and 2-12 on two (they wait on each other while other processes hold the cores).
LOCAL_AGENT_SERVER = {"max_tokens": 160}


def is_local(model: str | None) -> bool:
    """Whether `model` names the offline default model (the alias or one of its Inspect names)."""
    return model == LOCAL_ALIAS or model in LOCAL_MODELS


def resolve_agent_model(model: str | None) -> tuple[str | None, AbstractContextManager[object]]:
    """The Inspect model for `--model`, and what must run while the eval does.

    `local` (or the offline model's Inspect name with no LOCAL_BASE_URL set) becomes
    `openai-api/local/gemma-3-270m`, served by the shared local server, which the context starts (or
    joins, when another run holds it) and leaves at its end. Any other model is returned as it is, with
    nothing to run. Nothing starts until the context is entered: checks and the estimate come first.
    """
    if model == LOCAL_ALIAS:
        return LOCAL_INSPECT_MODEL, _serve_local()
    if model in LOCAL_MODELS and not os.environ.get("LOCAL_BASE_URL"):
        return model, _serve_local()
    return model, contextlib.nullcontext()


@contextlib.contextmanager
def _serve_local() -> Iterator[None]:
    """The shared local server, with Inspect's `openai-api` provider (service `local`) pointed at it and
    told its price (0), so that the log records the cost of real usage, not none."""
    from inspect_ai.model import ModelCost, ModelInfo, set_model_info

    free = ModelCost(input=0.0, output=0.0, input_cache_write=0.0, input_cache_read=0.0)
    for name in LOCAL_MODELS:
        set_model_info(name, ModelInfo(organization="Google", model="Gemma 3 270M (Q4_K_M, llama.cpp)",
                                       context_length=LOCAL_CONTEXT, cost=free))
    cores = usable_cores()
    options = {**LOCAL_AGENT_SERVER, **({"threads": 1} if cores <= 2 else {})}
    with shared_local_server(**options) as endpoint:
        variables = endpoint.inspect_env()
        saved = {name: os.environ.get(name) for name in variables}
        os.environ.update(variables)
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def _short(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def install_hint(extra: str) -> str:
    """The install command for an extra: editable into this interpreter in a source checkout."""
    root = Path(__file__).resolve().parents[3]
    if (root / "pyproject.toml").is_file() and (root / "src" / "openrebench").is_dir():
        return f"{_short(Path(sys.executable))} -m pip install -e '{_short(root)}[{extra}]'"
    return f"pip install 'openrebench[{extra}]'"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def check_client(model: str) -> None:
    """One line naming the extra when the model's provider needs a client that is missing or too old."""
    if model == LOCAL_ALIAS:
        model = LOCAL_INSPECT_MODEL
    need = CLIENTS.get(model.split("/", 1)[0])
    if need is None:
        return
    module, package, minimum, label, extra = need
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a missing parent package (google for google.genai)
        found = False
    if not found:
        raise OpenRebenchError(f"the model {model} needs {label}: {install_hint(extra)}")
    try:
        have = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return
    if _version(have) < _version(minimum):
        raise OpenRebenchError(f"the model {model} needs {package} >= {minimum} (found {have}): "
                               f"{install_hint(extra)}")


HOSTED = {"openai", "anthropic", "google", "openai-api"}  # their clients start offline, with keys checked


def check_credentials(model: str, base_url: str | None = None, model_args: Mapping[str, Any] | None = None
                      ) -> None:
    """For hosted providers, the credentials and settings Inspect needs to make the model: one line
    before anything is set up, not a provider's error at the first sample. Made with the eval's own
    `base_url` and model args (`-M api_key=…` is a credential too). Local providers are not made here
    (making an `hf/` or `vllm/` model loads it), nor is the offline model (it needs no key, and its
    server starts with the eval)."""
    if model.split("/", 1)[0] not in HOSTED or is_local(model):
        return
    from inspect_ai.model import get_model

    try:
        get_model(model, base_url=base_url, **(model_args or {}))
    except Exception as e:
        from rich.text import Text

        text = " ".join(str(getattr(e, "message", None) or e).split()).removeprefix("ERROR: ")
        with contextlib.suppress(Exception):  # Inspect words these for its own console, in rich markup
            text = Text.from_markup(text).plain
        raise OpenRebenchError(f"the model {model} cannot be used here: {text}") from None


@dataclass(frozen=True)
class Estimate:
    """The most a run can cost: every attempt uses its whole token limit, every token at the dearer price."""

    model: str
    envs: int
    epochs: int
    limits: list[Limits]  # one per environment and budget
    seconds: list[float]  # working time per attempt, one per environment and budget
    price: dict[str, float] | None
    source: str
    budgets: int = 1  # the working times of a campaign, each environment run at each

    @property
    def attempts(self) -> int:
        return self.envs * self.budgets * self.epochs

    @property
    def tokens(self) -> int | None:
        if any(lim.tokens is None for lim in self.limits):
            return None
        return self.epochs * sum(lim.tokens or 0 for lim in self.limits)

    @property
    def bound(self) -> float | None:
        if self.price is None or self.tokens is None:
            return None
        return self.tokens * max(self.price.get("input", 0.0), self.price.get("output", 0.0)) / 1e6

    def lines(self) -> list[str]:
        lim, per = self.limits[0], max(self.seconds)
        same = all(x == lim for x in self.limits) and all(s == per for s in self.seconds)
        each = (f"each stopped at {lim.describe()} or {fmt_duration(per)} of working time" if same
                else "limits scaled to each environment's working time")
        envs = f"{self.envs} environment{'s' * (self.envs != 1)}"
        if self.budgets > 1:
            envs += f" × {self.budgets} time limits"
        out = [f"Estimate: {self.attempts} attempt{'s' * (self.attempts != 1)} ({envs} × {self.epochs} "
               f"epoch{'s' * (self.epochs != 1)}), {each}."]
        tokens = "no token limit" if self.tokens is None else f"{fmt_tokens(self.tokens)} tokens at most"
        price = self.price or {}
        if self.price is None:
            out.append(f"Cost: {tokens}; the price of {self.model} is unknown (give it with --prices FILE).")
        elif self.source == "runs locally":
            out.append(f"Cost: {tokens}; {self.model} runs locally (no per-token price).")
        elif self.bound is None or self.tokens is None:
            out.append(f"Cost: no bound ({tokens}); {self.model} at ${price.get('input', 0):.2f}/"
                       f"${price.get('output', 0):.2f} per 1M input/output tokens ({self.source}).")
        else:
            dear = "output" if price.get("output", 0) >= price.get("input", 0) else "input"
            other = "input" if dear == "output" else "output"
            likely = self.tokens * price.get("input", 0.0) / 1e6
            out.append(f"Cost: at most ${self.bound:,.2f}: {fmt_tokens(self.tokens)} tokens × "
                       f"${price.get(dear, 0):.2f} per 1M ({self.model}'s {dear} price; {other} "
                       f"${price.get(other, 0):.2f}; {self.source}); about ${likely:,.2f} if, as usual, "
                       "nearly all are input tokens.")
        total, upto = fmt_duration(self.epochs * sum(self.seconds)), "" if same else "up to "
        out.append(f"Time: {upto}{fmt_duration(per)} of working time per attempt, at most {total} in all "
                   "(attempts run in parallel up to --max-samples).")
        return out

    def check(self, max_cost: float, yes: bool) -> None:
        if self.bound is not None and self.bound > max_cost and not yes:
            raise OpenRebenchError(f"the cost bound ${self.bound:,.2f} is above --max-cost ${max_cost:,.2f}: "
                                   "pass --yes to run anyway, or lower --token-limit, --epochs or the "
                                   "number of environments")


def estimate_run(model: str, env_ids: list[str], tier: str, seconds: float | Sequence[float | None] | None,
                 epochs: int, message_limit: int | str | None, token_limit: int | str | None,
                 prices_path: Path | None, *, agent: str) -> Estimate:
    """The bound of a model agent's run for `openrebench eval`, with the limits `rebench_task` will apply.
    `seconds`: the working time per attempt, or one per budget of a campaign (each environment runs at
    each); None: the tier's."""
    prices = None if prices_path is None else load_prices(prices_path)
    budgets = list(seconds) if isinstance(seconds, Sequence) else [seconds]
    per = [s if s is not None else get_environment(e).tier(tier).time_limit_hours * 3600
           for e in env_ids for s in budgets]
    price, source = find_price(model, prices)
    spec = get_agent(agent)
    return Estimate(model, len(env_ids), epochs, [spec.limits(s, message_limit, token_limit) for s in per],
                    per, price, source, budgets=len(budgets))
