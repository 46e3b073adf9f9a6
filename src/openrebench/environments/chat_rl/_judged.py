"""chat_rl's assets that need the judge (`build_with_judge`, through the run's model access): the starting
and reference models (their pipelines run on the base model against the judge) and, for the likelihood
judge, its scores of the reference answers, keyed by the judge model. Apart from `_assets.py`, which
builds what needs no judge, because these run the workspace's own pipeline scripts in child processes
whose model calls go through the run's gateway."""

from __future__ import annotations

import contextvars
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from openrebench.api import ModelAccess, OpenRebenchError, TierSpec, stage
from openrebench.lm import assets_root, cached_build

from . import chat_lm
from ._assets import BUILDER_VERSION, HERE, SHARED, Built, _manifest_key, build, settings, workspace_files
from .params import ChatRLParams, Pipeline


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def judged_dir(spec: TierSpec[ChatRLParams], cache_dir: Path, judge: str) -> Path:
    return assets_root(cache_dir) / f"chatrl-{spec.name}-judged-{_slug(judge)}"


def run_pipeline(
    spec: TierSpec[ChatRLParams],
    built: Built,
    script: Path,
    pipeline: Pipeline,
    access: ModelAccess,
    out: Path,
) -> dict[str, Any]:
    """Run an RL pipeline (`script`, as its workspace would) in a scratch workspace, its model calls
    through `access`; its model lands in `out`. Returns what it printed last (its summary, JSON)."""
    with tempfile.TemporaryDirectory(prefix="openrebench-chatrl-") as tmp:
        work = Path(tmp)
        for source, dest in workspace_files(built):
            (shutil.copytree if source.is_dir() else shutil.copy)(source, work / dest)
        (work / "settings.json").write_text(json.dumps(settings(spec.params)) + "\n")
        shutil.copy(script, work / "rl_finetune.py")
        args = [
            "--prompts",
            str(pipeline.prompts),
            "--samples",
            str(pipeline.samples),
            "--rounds",
            str(pipeline.rounds),
            "--steps",
            str(pipeline.steps),
            "--lr",
            str(pipeline.learning_rate),
            "--temperature",
            str(pipeline.temperature),
            "--device",
            spec.params.device,
            "--out",
            "model",
        ] + (["--mask-prompt"] if pipeline.mask_prompt else [])
        command = [*access.prefix, sys.executable, "rl_finetune.py", *args]
        result = subprocess.run(
            command,
            cwd=work,
            env={**os.environ, **access.env},
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        if result.returncode != 0 or not (work / "model" / chat_lm.WEIGHTS).is_file():
            tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
            raise OpenRebenchError(
                f"chat_rl: {script.parent.name}/rl_finetune.py failed (exit "
                f"{result.returncode}): {' | '.join(tail)[-400:]}"
            )
        shutil.copytree(work / "model", out)
        lines = [x for x in result.stdout.splitlines() if x.startswith("{")]
        return json.loads(lines[-1]) if lines else {}


def build_with_judge(spec: TierSpec[ChatRLParams], cache_dir: Path, access: ModelAccess) -> Path:
    """The starting and reference models trained against the run's judge, and the judge's scores of
    the reference answers (likelihood judge), in `judged_dir(...)`."""
    p = spec.params
    built = build(spec, cache_dir)
    judge = str(access.models.get("judge") or "")
    if not judge:
        raise OpenRebenchError("chat_rl needs a judge model (the role 'judge')")
    folder = judged_dir(spec, cache_dir, judge)

    def make(partial: Path, deadline: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        stats: dict[str, Any] = {}
        done = partial / "work" / "done.json"  # an interrupted build goes on after the last step done
        if done.is_file():
            stats = json.loads(done.read_text())
        todo = [(which, pipeline) for which, pipeline in (("start", p.start), ("reference", p.reference))
                if not (which in stats and (partial / which / chat_lm.WEIGHTS).is_file())]
        lock = threading.Lock()

        def one(which: str, pipeline: Pipeline) -> None:
            shutil.rmtree(partial / which, ignore_errors=True)
            with stage(f"the {which} pipeline against {judge}"):
                result = run_pipeline(spec, built, HERE / ("starting" if which == "start" else which)
                                      / "rl_finetune.py", pipeline, access, partial / which)
            with lock:
                stats[which] = result
                done.write_text(json.dumps(stats))

        # The two pipelines are independent (each seeded, each a child process of one math thread, the
        # judge's answers the same whatever else it scores): run together, they share the cores that
        # one alone leaves idle while it waits on the judge.
        with ThreadPoolExecutor(max_workers=len(todo) or 1) as pool:
            futures = [pool.submit(contextvars.copy_context().run, one, which, pipeline)
                       for which, pipeline in todo]
            for future in futures:
                future.result()
        if p.judge_method == "likelihood":
            with stage(f"{judge}'s scores of the reference answers"):
                stats["scores"] = _reference_scores(built, access, partial / "scores.json", p.judge_workers)
        return {"judge": judge}, stats

    scripts = {name: _digest(HERE / name / "rl_finetune.py") for name in ("starting", "reference")}
    cached_build(
        folder,
        what=f"chatrl:{spec.name}-judged",
        builder_version=BUILDER_VERSION,
        seed=0,
        params={
            "judge": judge,
            "answers": _manifest_key(built.answers),
            "start": p.start.model_dump(),
            "reference": p.reference.model_dump(),
            "scripts": scripts,
            "shared": {f: _digest(HERE / f) for f in SHARED},
        },
        build=make,
        label=f"chat_rl: the models trained against {judge}",
    )
    return folder


def _digest(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def _reference_scores(built: Built, access: ModelAccess, out: Path, workers: int) -> dict[str, Any]:
    """The likelihood judge's scores of both reference models' held-out answers, by a child process
    started through `access` (the judge is reached from there)."""
    result = subprocess.run(
        [
            *access.prefix,
            sys.executable,
            "-m",
            "openrebench.environments.chat_rl._judge_answers",
            str(built.answers / "heldout.jsonl"),
            str(out),
            str(workers),
        ],
        env={**os.environ, **access.env},
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    if result.returncode != 0:
        tail = result.stderr.strip().splitlines()[-1:] or ["no output"]
        raise OpenRebenchError(f"chat_rl: the judge could not score the reference answers: {tail[0][:300]}")
    scores = json.loads(out.read_text())
    failed = {k: sum(v is None for v in scores[k]) for k in ("base", "sft")}
    if any(failed.values()):
        raise OpenRebenchError(f"chat_rl: the judge failed on some reference answers ({failed})")
    return {"failed": failed}
