"""chat_rl's scorer: the submitted model's answers to the held-out instructions, judged against the base
model's and the SFT model's.

No code of the solution runs here: the submission is weights. `model/model.safetensors` is read with
safetensors (nothing unpickled) into the base model's architecture, every tensor checked (names,
shapes, floating dtype, finite); the submission's own config.json is not trusted (the base's, in
`protected/`, is used). The scorer samples one answer per held-out instruction with the tier's fixed
settings and a fresh seed, and asks the judge (the run's `judge` role, through the gateway) to compare
it with each reference model's stored answer (a prompted judge: in both orders, under labels drawn at
random per pair, its verdict read from their log-probabilities; see evaluation.py). A judge call that
fails after its retries (the judge unreachable, its backend down) is counted and left out of the win
rates, never counted as a loss; more than `MAX_LEFT_OUT` of the comparisons left out make the scoring
invalid. A verdict the answers themselves prevent (a reply naming neither label, a request the backend refuses
for its content) counts as a loss: otherwise a model could dodge the comparisons it would lose. The
message gives counts only, never an instruction or an answer.
"""

from __future__ import annotations

import asyncio
import json
import math
import secrets
import statistics
import time
from pathlib import Path
from typing import Any

from openrebench.api import ScoreResult, TierSpec

from . import chat_lm, evaluation
from .params import ChatRLParams

MAX_WEIGHTS_BYTES = 8 << 30
FLOAT_DTYPES = ("F32", "F16", "BF16")
MAX_LEFT_OUT = 0.05  # the share of comparisons that may fail and be left out of a valid scoring


def load_submission(folder: Path, config: dict[str, Any], device: str) -> Any:
    """The submitted weights in the base model's architecture, or ValueError naming what is wrong."""
    import torch
    from safetensors import safe_open
    from transformers import GPT2Config, GPT2LMHeadModel

    weights = folder / chat_lm.WEIGHTS
    if not folder.is_dir():
        raise ValueError(
            "there is no model/ folder in the workspace (save the model with "
            "chat_lm.save_model(model, 'model'))"
        )
    if weights.is_symlink() or not weights.is_file():
        raise ValueError(f"model/{chat_lm.WEIGHTS} is missing (only safetensors weights are read)")
    if weights.stat().st_size > MAX_WEIGHTS_BYTES:
        raise ValueError(f"model/{chat_lm.WEIGHTS} is larger than {MAX_WEIGHTS_BYTES >> 30} GB")
    model = GPT2LMHeadModel(GPT2Config.from_dict(config))
    expected = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    try:
        with safe_open(str(weights), framework="pt") as f:
            names = set(f.keys())
            missing = sorted(set(expected) - names)
            extra = sorted(names - set(expected) - {"lm_head.weight"})
            if missing or extra:
                raise ValueError(
                    f"model/{chat_lm.WEIGHTS} is not the base model's architecture "
                    f"(missing {missing[:3]}, unexpected {extra[:3]})"
                )
            state = {}
            for name, target in expected.items():
                if f.get_slice(name).get_dtype() not in FLOAT_DTYPES:
                    raise ValueError(f"the weight {name} is not a floating-point tensor")
                tensor = f.get_tensor(name)
                if tuple(tensor.shape) != tuple(target.shape):
                    raise ValueError(
                        f"the weight {name} has shape {tuple(tensor.shape)}, the base model's "
                        f"{tuple(target.shape)}"
                    )
                if not torch.isfinite(tensor).all():
                    raise ValueError(f"the weight {name} has non-finite values")
                state[name] = tensor.to(target.dtype)
    except ValueError:
        raise
    except Exception as e:
        raise ValueError(
            f"model/{chat_lm.WEIGHTS} cannot be read as safetensors ({type(e).__name__})"
        ) from None
    model.load_state_dict(state, strict=False)
    model.tie_weights()
    return model.to(device).eval()


def _win_rate(prefs: list[float | None]) -> tuple[float | None, int]:
    judged = [x for x in prefs if x is not None]
    return (statistics.fmean(judged) if judged else None), len(prefs) - len(judged)


async def _judge(
    p: ChatRLParams, rows: list[dict[str, Any]], answers: list[str], cached: dict[str, Any] | None, seed: int
) -> dict[str, list[float | None]]:
    import openai

    client = openai.AsyncOpenAI(max_retries=0, timeout=600)
    prompts = [r["instruction"] for r in rows]
    out: dict[str, list[float | None]] = {}
    if p.judge_method == "likelihood":
        ours = await evaluation.likelihood_scores(
            client, list(zip(prompts, answers, strict=True)), max_workers=p.judge_workers, rejected=-math.inf
        )
        for name in ("base", "sft"):
            theirs = (cached or {}).get(name)
            if theirs is None or len(theirs) != len(rows):
                theirs = await evaluation.likelihood_scores(
                    client,
                    [(q, r[f"{name}_answer"]) for q, r in zip(prompts, rows, strict=True)],
                    max_workers=p.judge_workers,
                )
            out[name] = [evaluation.preference(a, b) for a, b in zip(ours, theirs, strict=True)]
        return out
    for k, name in enumerate(("base", "sft")):
        pairs = [(a, r[f"{name}_answer"]) for a, r in zip(answers, rows, strict=True)]
        out[name] = await evaluation.evaluate(
            prompts, pairs, p.judge_workers, client=client, method="prompted", seed=seed + k, unreadable=0.0
        )
    return out


def score(spec: TierSpec[ChatRLParams], solution: Path, protected: Path) -> ScoreResult:
    p = spec.params
    started = time.monotonic()
    config = json.loads((protected / "base_config.json").read_text())
    try:
        model = load_submission(solution / "model", config, p.device)
    except ValueError as e:
        return ScoreResult.invalid(f"Invalid: {e}.")
    tokenizer = chat_lm.ChatTokenizer(protected / "tokenizer")
    rows = chat_lm.read_jsonl(protected / "heldout.jsonl")
    scores_path = protected / "scores.json"
    cached = json.loads(scores_path.read_text()) if scores_path.is_file() else None
    seed = secrets.randbits(31)
    answers = chat_lm.generate(
        model,
        tokenizer,
        [r["instruction"] for r in rows],
        max_new_tokens=p.max_new_tokens,
        temperature=p.temperature,
        top_k=p.top_k,
        seed=seed,
    )
    generate_s = time.monotonic() - started
    prefs = asyncio.run(_judge(p, rows, answers, cached, seed))
    (win_base, failed_base), (win_sft, failed_sft) = _win_rate(prefs["base"]), _win_rate(prefs["sft"])
    failures = failed_base + failed_sft
    empty = sum(not a for a in answers)
    details = {
        "win_vs_base": win_base,
        "win_vs_sft": win_sft,
        "judge_failures": failures,
        "empty_answers": empty,
        "n_prompts": len(rows),
        "seed": seed,
        "generate_s": round(generate_s, 2),
        "judge_s": round(time.monotonic() - started - generate_s, 2),
        "mean_answer_chars": statistics.fmean(len(a) for a in answers) if answers else 0.0,
    }
    if win_base is None or win_sft is None:
        return ScoreResult.invalid(
            f"Invalid: the judge could not compare any answers ({failures} judge failures after retries).",
            **details,
        )
    if failures > MAX_LEFT_OUT * 2 * len(rows):
        return ScoreResult.invalid(  # how many is in the details: the answers the model gave can fail a call
            f"Invalid: the judge could not be asked for more than {MAX_LEFT_OUT:.0%} of the comparisons "
            "(left out, they would leave the win rates to the rest).",
            **details,
        )
    raw = (win_base + win_sft) / 2
    if not math.isfinite(raw):
        return ScoreResult.invalid("Invalid: the win rates are not finite.", **details)
    # The win rates and nothing else the model decided: how many answers were empty, how many comparisons
    # failed and how long it took are numbers the model sets after reading the held-out instructions, so
    # they stay in the details (the agent counts empty answers on its own instructions with evaluation.py).
    return ScoreResult(
        raw=raw,
        message=(
            f"Valid: mean win rate {raw:.3f} (against the base model {win_base:.3f}, against the SFT model "
            f"{win_sft:.3f}) on {len(rows)} held-out instructions."
        ),
        details=details,
    )
