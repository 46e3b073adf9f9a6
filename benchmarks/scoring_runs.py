"""Shared by the benchmarks of environments that call models while scoring: set up a run of the
starting and one of the reference solution (with the tier's models through the gateway), score each
`repeats` times, interleaved, and record every scoring with its model usage."""

from __future__ import annotations

import json
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from openrebench.harness import RunModels
from openrebench.runs import Run, detect_hardware, get_environment, install_reference, score_run, start_run


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "sd": statistics.stdev(values) if len(values) > 1 else 0.0}


def one_scoring(run: Run, models: RunModels,
                fields: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
    """One scoring: raw, message, seconds, the scoring grant's model usage, and `fields(details)`."""
    t0 = time.monotonic()
    row = score_run(run, kind="calibration", charged=False, access=models.scoring)
    total = (row.details.get("models") or {}).get("total") or {}
    return {"raw": row.raw, "message": row.message, "seconds": round(time.monotonic() - t0, 1),
            "requests": total.get("requests"), "prompt_tokens": total.get("prompt_tokens"),
            "completion_tokens": total.get("completion_tokens"), "cost_usd": total.get("cost_usd"),
            **fields(row.details)}


def score_both(env_id: str, tier: str, repeats: int, overrides: dict[str, str],
               fields: Callable[[dict[str, Any]], dict[str, Any]], console: Console
               ) -> tuple[RunModels, dict[str, list[dict[str, Any]]], dict[str, float]]:
    """Every scoring of the start and the reference, and the seconds each set-up took (asset builds
    included, where the cache did not hold them)."""
    env = get_environment(env_id)
    models = RunModels.for_tier(env, tier, overrides)
    assert models is not None, f"{env_id} ({tier}) declares no models"
    scorings: dict[str, list[dict[str, Any]]] = {"start": [], "reference": []}
    setup_s: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix=f"{env_id}-bench-") as tmp:
        runs = {}
        for which in scorings:
            t0 = time.monotonic()
            runs[which], _ = start_run(env, tier, Path(tmp) / which, score_start=False, access=models.scoring,
                                       models=overrides)
            if which == "reference":
                install_reference(runs[which])
            setup_s[which] = round(time.monotonic() - t0, 1)
        for i in range(repeats):
            for which, run in runs.items():
                result = one_scoring(run, models, fields)
                scorings[which].append(result)
                console.print(f"{which} #{i + 1}: raw {result['raw']}, {result['seconds']} s, "
                              f"{result['prompt_tokens']} / {result['completion_tokens']} tokens",
                              highlight=False)
    return models, scorings, setup_s


def summarise(scorings: dict[str, list[dict[str, Any]]], keys: tuple[str, ...]) -> dict[str, Any]:
    """The spread of each of `keys` over each solution's valid scorings."""
    out: dict[str, Any] = {}
    for which, rows in scorings.items():
        valid = [r for r in rows if r["raw"] is not None]
        out[which] = {k: spread([float(r.get(k) or 0) for r in valid]) for k in keys} if valid else None
        if valid:
            out[which]["valid"] = len(valid)
    return out


def write(out: Path | None, console: Console, **record: Any) -> None:
    if out is None:
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": shlex.join([Path(sys.executable).name, *sys.argv]),
                               "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               "hardware": detect_hardware().model_dump(), **record}, indent=2) + "\n")
    console.print(f"written to {out}")
