"""Real models: the client package each Inspect provider needs, and a cost bound before a run.

Inspect checks a provider's client only when `eval` creates the model, with its own pip hint;
`check_client` names the openrebench extra that installs it, before any run is set up.
The prices come from the gateway's table (`openrebench.gateway`), overridable with `--prices`.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from openrebench.api import OpenRebenchError
from openrebench.gateway import find_price, load_prices
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


def check_credentials(model: str) -> None:
    """For hosted providers, the credentials and settings Inspect needs to make the model: one line
    before anything is set up, not a provider's error at the first sample. Local providers are not
    made here (making an `hf/` or `vllm/` model loads it)."""
    if model.split("/", 1)[0] not in HOSTED:
        return
    from inspect_ai.model import get_model

    try:
        get_model(model)
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
    limits: list[Limits]  # one per environment
    seconds: list[float]  # working time per attempt, one per environment
    price: dict[str, float] | None
    source: str

    @property
    def attempts(self) -> int:
        return self.envs * self.epochs

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


def estimate_run(model: str, env_ids: list[str], tier: str, seconds: float | None, epochs: int,
                 message_limit: int | str | None, token_limit: int | str | None,
                 prices_path: Path | None, *, agent: str) -> Estimate:
    """The bound of a model agent's run for `openrebench eval`, with the limits `rebench_task` will apply."""
    prices = None if prices_path is None else load_prices(prices_path)
    per = [seconds if seconds is not None else get_environment(e).tier(tier).time_limit_hours * 3600
           for e in env_ids]
    price, source = find_price(model, prices)
    spec = get_agent(agent)
    return Estimate(model, len(env_ids), epochs, [spec.limits(s, message_limit, token_limit) for s in per],
                    per, price, source)
