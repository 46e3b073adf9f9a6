"""Inspect logs for the analysis tests: a real log written by `openrebench eval` (oracle, mini tier) and
variants of it, changed through inspect_ai's own types and written with write_eval_log."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from inspect_ai.log import EvalLog, read_eval_log, write_eval_log
from inspect_ai.model import ModelUsage

REAL_LOG = Path(__file__).parent / "data" / "analysis" / "oracle-optimize_kernel-mini.eval"


@cache
def _real() -> EvalLog:
    """REAL_LOG as the harness writes it now: the file predates the scorer's rename (`run_score` to
    `rebench_scorer`), which the analysis still reads (tests/analysis/test_analysis_load.py)."""
    log = read_eval_log(str(REAL_LOG))
    for sample in log.samples or []:
        scores = sample.scores or {}
        sample.scores = {("rebench_scorer" if k == "run_score" else k): v for k, v in scores.items()}
    return log


def real_log() -> EvalLog:
    """A fresh copy of the real log (one sample: the oracle scores the reference, normalised ≈ 1.01)."""
    return copy.deepcopy(_real())


def write_variant(path: Path, edit: Callable[[EvalLog], None]) -> Path:
    log = real_log()
    log.eval.eval_id = uuid.uuid4().hex
    edit(log)
    write_eval_log(log, str(path))
    return path


def runs_log(path: Path, *, agent: str, model: str, hours: float,
             runs: Sequence[Sequence[tuple[float, float]]], tokens: int = 0, cost: float | None = None,
             gpus: int = 0, gateway: Sequence[Mapping[str, Any] | None] | None = None,
             tier: str = "mini") -> Path:
    """A log with one sample per run; each run is a list of (elapsed hours, normalised score) scorings
    after the set-up scoring. The sample's score is the run's best, as the harness reports it.
    `gateway`, per run: the score metadata's `gateway_usage` (the environment's own model calls), or
    None for a run without it. `tier`: where the log, the sample and the run fingerprint record it (the
    real log is a mini run; its constants stay, which is all the analysis reads of them)."""

    def edit(log: EvalLog) -> None:
        assert log.samples
        template = log.samples[0]
        setup_row = template.scores["rebench_scorer"].metadata["score_log"][0]  # type: ignore[index,union-attr]
        constants = template.scores["rebench_scorer"].metadata["fingerprint"]["constants"]  # type: ignore[index,union-attr]
        start, span = constants["start"], constants["reference"] - constants["start"]
        log.eval.metadata = {**(log.eval.metadata or {}), "agent": agent, "tier": tier}
        log.eval.model = model
        log.eval.config.working_limit = int(hours * 3600)
        samples = []
        for epoch, scorings in enumerate(runs, 1):
            sample = copy.deepcopy(template)
            sample.epoch = epoch
            sample.metadata = {**(sample.metadata or {}), "tier": tier}
            sample.working_time = hours * 3600 * 0.9
            rows = [dict(setup_row)]
            for i, (t, norm) in enumerate(scorings, 1):  # raw scores that normalise to `norm`
                rows.append({**setup_row, "index": i, "elapsed_s": t * 3600, "kind": "score", "charged": True,
                             "raw": start + norm * span, "normalised": norm})
            score = sample.scores["rebench_scorer"]  # type: ignore[index]
            score.value = max([0.0, *(n for _, n in scorings)])
            score.metadata = {**(score.metadata or {}), "score_log": rows,
                              "raw": start + score.value * span if scorings else None}
            score.metadata["fingerprint"] = copy.deepcopy(score.metadata["fingerprint"])
            score.metadata["fingerprint"]["hardware"]["gpu_count"] = gpus
            score.metadata["fingerprint"]["tier"] = tier
            if gateway is not None and gateway[epoch - 1] is not None:
                score.metadata["gateway_usage"] = copy.deepcopy(gateway[epoch - 1])
            usage = ModelUsage(input_tokens=tokens // 2, output_tokens=tokens - tokens // 2,
                               total_tokens=tokens, total_cost=cost)
            sample.model_usage = {model: usage} if tokens else {}
            samples.append(sample)
        log.samples = samples

    return write_variant(path, edit)


def react_log(path: Path) -> Path:
    """Three 30-minute runs of a model agent on one GPU, with tokens and dollars."""
    return runs_log(path, agent="react", model="openai/gpt-4o", hours=0.5, tokens=50_000, cost=0.8, gpus=1,
                    runs=[[(0.05, 0.1), (0.3, 0.6)], [(0.1, 0.2)], [(0.2, 0.0), (0.45, 0.9)]])


def gateway_usage(requests: int, tokens_in: int, tokens_out: int, cost: float | None,
                  failures: int = 0, roles: Mapping[str, tuple[int, int, int, float | None]] | None = None
                  ) -> dict[str, Any]:
    """The harness's `gateway_usage` record of one run: totals, and by role (requests, in, out, cost)."""

    def block(n: int, i: int, o: int, c: float | None, f: int = 0) -> dict[str, Any]:
        return {"requests": n, "input_tokens": i, "output_tokens": o, "cost_usd": c, "failures": f}

    return {"total": block(requests, tokens_in, tokens_out, cost, failures),
            "roles": {r: block(*v) for r, v in (roles or {}).items()}}
