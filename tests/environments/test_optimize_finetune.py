"""optimize_finetune on the mini tier: the start and the reference scored through the real pipeline,
the known cheats and broken pipelines each invalid with a one-line reason, and the pieces the scorer
relies on (the seed line, the instructions)."""

from __future__ import annotations

import math
import os
import random
import shutil
from pathlib import Path

import pytest

from openrebench.environments.optimize_finetune._cheats import CHEATS, install_cheat
from openrebench.environments.optimize_finetune.env import CONFIG, OUTPUT_DIR, Setup
from openrebench.environments.optimize_finetune.scorer import prepare_inputs, run_pipeline, set_seed
from openrebench.runs import Run, _scoring, get_environment, install_reference, score_run, start_run

pytest_plugins = ["lm_support"]


@pytest.fixture(scope="session")
def finetune_home(lm_home: Path, lm_sources: Path) -> Path:
    """The mini assets (initial model, records; the tokenizer and corpus come with lm_home), built once."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENREBENCH_SOURCES", str(lm_sources))
        mp.setenv("OPENREBENCH_HOME", str(lm_home))
        get_environment("optimize_finetune").build_assets("mini", lm_home)
    return lm_home


@pytest.fixture
def run(finetune_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Run:
    monkeypatch.setenv("OPENREBENCH_HOME", str(finetune_home))
    return start_run("optimize_finetune", "mini", tmp_path / "run", score_start=False)[0]


def test_the_seed_line_is_set_and_required() -> None:
    config = "seed: 17\nmodel:\n  seed: 3\n"
    assert set_seed(config, 99) == "seed: 99\nmodel:\n  seed: 3\n"
    assert set_seed("model:\n  seed: 3\n", 99) is None
    assert set_seed("seed: 1\nseed: 2\n", 99) is None


def test_workspace_protected_and_instructions(run: Run) -> None:
    env = get_environment("optimize_finetune")
    ws, protected = run.workspace, run.protected
    for name in ("finetune.sh", CONFIG, "finetune_data.jsonl", "train.py", "initial_model/config.json",
                 "initial_model/model.safetensors", "tokenizer/vocab.json"):
        assert (ws / name).is_file(), name
    assert not (ws / "finetune.py").exists()  # the reference stays out of the workspace
    assert set_seed((ws / CONFIG).read_text(), 5) is not None
    assert (protected / "reference" / "finetune.py").is_file() and (protected / "pool.jsonl").is_file()
    setup = Setup.model_validate_json((protected / "setup.json").read_text())
    assert len((protected / "pool.jsonl").read_text().splitlines()) > setup.records
    for tier in env.tiers:
        text = env.instructions(tier)
        assert "$" not in text and "finetune.sh" in text and "ln(seconds)" in text
        assert f"{env.tier(tier).params.records} records" in text


@pytest.mark.slow
def test_start_and_reference_are_valid_and_the_reference_is_faster(run: Run) -> None:
    env = get_environment("optimize_finetune")
    start = score_run(run)
    assert start.raw is not None, start.message
    install_reference(run)
    ref = score_run(run)
    assert ref.raw is not None, ref.message
    assert ref.raw < start.raw - 0.3, (start.message, ref.message)  # at least 1.35x faster
    params = env.tier("mini").params
    for row in (start, ref):
        assert row.details["relative_l1"] <= params.max_relative_l1
        # the time counts relative to this scoring's own reference run (machine-speed drift cancels)
        d = row.details
        adjusted = d["seconds"] * params.reference_run_s / d["reference_seconds"]
        assert math.isclose(d["adjusted_seconds"], adjusted) and math.isclose(row.raw, math.log(adjusted))
        assert "counts as" in row.message
    assert start.details["seed"] != ref.details["seed"]


@pytest.fixture(scope="module")
def earlier_run(finetune_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Weights from an honest run of the reference pipeline on another seed and sample of the data."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENREBENCH_HOME", str(finetune_home))
        earlier = start_run("optimize_finetune", "mini", tmp_path_factory.mktemp("earlier") / "run",
                            score_start=False)[0]
    protected, folder = earlier.protected, earlier.path / "pipeline"
    folder.mkdir()
    for f in (protected / "reference").iterdir():
        shutil.copyfile(f, folder / f.name)
    pool = (protected / "pool.jsonl").read_text().splitlines(keepends=True)
    records = random.Random(0).sample(pool, Setup.model_validate_json((protected / "setup.json").read_text())
                                      .records)
    config = set_seed((protected / CONFIG).read_text(), 123)
    assert config is not None
    prepare_inputs(folder, protected, 123, records, config, None, link=True)
    outcome = run_pipeline(folder, 300, drop=False, threads=1)
    assert outcome.exit_code == 0, outcome.tail
    return folder / OUTPUT_DIR


CHEAT_REASONS = {
    "initial_weights": "holds the initial weights unchanged: finetune.sh must train the model",
    "stale_copy": "the weights differ from this scoring's reference run by",
    "clock": "process(es) it started kept running for more than 5 s (they were killed)",
}


@pytest.mark.slow
@pytest.mark.parametrize("name", CHEATS)
def test_cheats_are_invalid(run: Run, name: str, request: pytest.FixtureRequest) -> None:
    earlier = request.getfixturevalue("earlier_run") if name == "stale_copy" else None
    install_cheat(name, run.workspace, earlier)
    row = score_run(run)
    assert row.raw is None and row.message.startswith("Invalid: ")
    assert CHEAT_REASONS[name] in row.message.splitlines()[0], row.message
    if name == "stale_copy":
        assert row.details["relative_l1"] > 100 * get_environment("optimize_finetune").tier(
            "mini").params.max_relative_l1


WRONG_SHAPE = """#!/usr/bin/env bash
cp -r initial_model trained_model
python - <<'PY'
from safetensors.torch import load_file, save_file
weights = load_file("trained_model/model.safetensors")
weights["transformer.h.0.mlp.c_fc.weight"] = weights["transformer.h.0.mlp.c_fc.weight"][:, :8].clone()
save_file(weights, "trained_model/model.safetensors", metadata={"format": "pt"})
PY
"""

BROKEN = {
    "exits non-zero": ("#!/usr/bin/env bash\necho 'out of luck' >&2\nexit 3\n",
                       "finetune.sh exited with code 3 (its output is not shown"),
    "writes nothing": ("#!/usr/bin/env bash\ntrue\n", "finetune.sh did not write trained_model/"),
    "wrong config": ("#!/usr/bin/env bash\ncp -r initial_model trained_model\n"
                     "sed -i 's/\"n_embd\": 128/\"n_embd\": 256/' trained_model/config.json\n",
                     "architecture: config.json's n_embd is not the initial model's (128)"),
    "wrong shape": (WRONG_SHAPE, "h.0.mlp.c_fc.weight does not have the model's shape [128, 512]"),
    "hangs": ("#!/usr/bin/env bash\nsleep 1000\n", "took longer than the 8 s scoring limit"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BROKEN))
def test_broken_pipelines_are_invalid(run: Run, name: str) -> None:
    script, reason = BROKEN[name]
    (run.workspace / "finetune.sh").write_text(script)
    row = score_run(run, timeout_s=8 if name == "hangs" else None)
    assert row.raw is None and row.message.startswith("Invalid: ")
    assert reason in row.message, row.message
    if name == "exits non-zero":  # what the pipeline printed, after reading held-out records, stays hidden
        assert "out of luck" not in row.message and "out of luck" in row.details["output_tail"]


def test_a_config_without_its_seed_line_is_invalid(run: Run) -> None:
    config = run.workspace / CONFIG
    config.write_text(config.read_text().replace("seed: 17\n", ""))
    row = score_run(run)
    assert row.raw is None and "must keep exactly one top-level `seed:` line" in row.message


LEFT_WORK = """#!/usr/bin/env bash
set -e
mkdir -p /tmp/triton/abc /tmp/torchinductor_root /dev/shm/left
echo POISON > /tmp/triton/abc/kernel.so
echo POISON > /tmp/torchinductor_root/x
( setsid sh -c 'sleep 1.5; python train_late.py' > /dev/null 2>&1 & )
exit 0
"""

TRAIN_LATE = """import shutil
import numpy as np
from safetensors.numpy import load_file, save_file
shutil.copytree("initial_model", "trained_model", copy_function=shutil.copyfile)
weights = load_file("trained_model/model.safetensors")
weights["transformer.h.0.mlp.c_fc.weight"] += np.float32(1e-3)
save_file(weights, "trained_model/model.safetensors", metadata={"format": "pt"})
"""

SPY_REFERENCE = """#!/usr/bin/env bash
python - <<'PY'
import os
uids = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        uids.append(os.stat(f"/proc/{pid}").st_uid)
    except OSError:
        pass
print("solution processes:", sum(1 for u in uids if u != 0))  # the scorer is root; the solution not
left = ("/tmp/triton", "/tmp/torchinductor_root", "/dev/shm/left")
print("left files:", [p for p in left if os.path.exists(p)])
for v in ("TMPDIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "HF_HOME", "XDG_CACHE_HOME"):
    print(v, os.environ[v].startswith(os.environ["HOME"] + "/"), os.listdir(os.environ[v]))
print("uid", os.getuid())
PY
exit 1
"""


@pytest.mark.slow
def test_work_left_running_is_counted_and_cannot_reach_the_reference_run(run: Run) -> None:
    """In the scoring sandbox: work a daemon finishes after finetune.sh exits is timed (the harness's
    cgroup), and the reference run (a spy here) starts with nothing of the solution's alive and none of
    its files in /tmp and /dev/shm, its caches in a fresh home."""
    from openrebench.isolation import bwrap_binary

    if bwrap_binary() is None:
        pytest.skip("bubblewrap is not available")
    (run.workspace / "finetune.sh").write_text(LEFT_WORK)
    (run.workspace / "train_late.py").write_text(TRAIN_LATE)
    (run.protected / "reference" / "finetune.sh").write_text(SPY_REFERENCE)
    _scoring._record_protected(run)  # the spy is this test's set-up, not a change behind the scorer
    row = score_run(run, sandboxed=True)
    assert row.raw is None and "the scorer's own reference run failed" in row.message, row.message
    d = row.details
    if os.geteuid() == 0:  # the harness could make the scoring's cgroup and bind its sub-group in
        assert d["accounting"].startswith("cgroup") and "harness" in d["accounting"], d["accounting"]
    assert d["seconds"] >= 1.5 and d["exit_code"] == 0
    tail = d["reference_tail"]
    assert "solution processes: 0" in tail and "left files: []" in tail, tail
    for v in ("TMPDIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "HF_HOME"):
        assert f"{v} True []" in tail, tail
    assert "XDG_CACHE_HOME True" in tail and "uid 0" in tail
