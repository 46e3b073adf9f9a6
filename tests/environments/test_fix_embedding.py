"""fix_embedding on the mini tier: assets, the start and reference scores, and what the scorer refuses."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch

from openrebench.lm import GPT, GPTConfig, save_checkpoint
from openrebench.runs import Run, get_environment, install_reference, score_run, start_run

pytest_plugins = ["lm_support"]


@pytest.fixture(scope="session")
def fixemb_home(lm_home: Path, lm_sources: Path) -> Path:
    """The mini assets (data, both models, the permutation, the reference fix), built once."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENREBENCH_SOURCES", str(lm_sources))
        mp.setenv("OPENREBENCH_HOME", str(lm_home))
        get_environment("fix_embedding").build_assets("mini", lm_home)
    return lm_home


@pytest.fixture
def run(fixemb_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Run:
    monkeypatch.setenv("OPENREBENCH_HOME", str(fixemb_home))
    return start_run("fix_embedding", "mini", tmp_path / "run", score_start=False)[0]


def test_workspace_has_the_models_and_data_but_not_the_heldout_split(run: Run) -> None:
    ws = run.workspace
    for name in ("large_model/model.safetensors", "small_model/model.safetensors", "fixed_model/config.json",
                 "data/train.bin", "data/val.bin", "data/vocab.json", "example.py"):
        assert (ws / name).is_file(), name
    assert not list(ws.rglob("heldout*"))
    assert (run.protected / "heldout.bin").is_file()
    heldout = (run.protected / "heldout.bin").read_bytes()[:4096]
    for name in ("train.bin", "val.bin"):
        assert heldout not in (ws / "data" / name).read_bytes()


def test_start_is_near_useless_and_the_reference_recovers(run: Run) -> None:
    start = score_run(run)
    assert start.raw is not None, start.message
    assert start.details["loss"] > 8  # a permuted embedding is worse than guessing uniformly (ln 4096 = 8.3)
    install_reference(run)
    ref = score_run(run)
    assert ref.raw is not None, ref.message
    assert ref.details["loss"] < 6.5 and ref.raw < start.raw - 0.5
    assert ref.normalised is not None and ref.normalised >= 0.9


def _save(run: Run, model: GPT) -> None:
    save_checkpoint(run.workspace / "fixed_model", model)


def test_a_different_architecture_is_invalid(run: Run) -> None:
    config = GPTConfig.model_validate_json((run.protected / "model_config.json").read_text())
    _save(run, GPT(config.model_copy(update={"n_embd": config.n_embd * 2})))
    row = score_run(run)
    assert row.raw is None and "architecture" in row.message and "shape" in row.message


def test_nan_weights_and_missing_output_are_invalid(run: Run) -> None:
    config = GPTConfig.model_validate_json((run.protected / "model_config.json").read_text())
    model = GPT(config)
    with torch.no_grad():
        model.transformer.h[0].mlp.c_fc.weight[0, 0] = float("nan")
    _save(run, model)
    row = score_run(run)
    assert row.raw is None and "NaN" in row.message
    for f in (run.workspace / "fixed_model").iterdir():
        f.unlink()
    row = score_run(run)
    assert row.raw is None and "no model.safetensors" in row.message


class _Payload:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {_Payload.marker}",))

    marker = ""


def test_a_pickle_that_runs_code_is_refused_not_run(run: Run, tmp_path: Path) -> None:
    _Payload.marker = str(tmp_path / "pwned")
    out = run.workspace / "fixed_model"
    (out / "model.safetensors").unlink()
    (out / "model.pt").write_bytes(pickle.dumps({"transformer.wte.weight": _Payload()}))
    row = score_run(run)
    assert row.raw is None and "could not read the weights" in row.message
    assert not (tmp_path / "pwned").exists()


def _embedding(folder: Path) -> torch.Tensor:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")["transformer.wte.weight"]


def test_each_run_gets_its_own_secret_permutation(run: Run, fixemb_home: Path, tmp_path: Path) -> None:
    """The permutation is fresh per run and follows from nothing the agent can read: not the seeds in
    the package's parameters, not a file in the workspace."""
    from openrebench.environments.fix_embedding import _assets, scorer

    env = get_environment("fix_embedding")
    spec = env.tier("mini")
    other = start_run("fix_embedding", "mini", tmp_path / "other", score_start=False)[0]
    original = _embedding(_assets.build(spec, fixemb_home).large)
    perms = []
    for r in (run, other):
        permuted = _embedding(r.workspace / "large_model")
        # each row of the permuted matrix is a row of the original: recover the permutation exactly
        index = {tuple(row.tolist()): i for i, row in enumerate(original)}
        perms.append(torch.tensor([index[tuple(row.tolist())] for row in permuted]))
        assert sorted(perms[-1].tolist()) == list(range(len(original)))
        assert torch.equal(_embedding(r.workspace / "fixed_model"), permuted)  # the starting solution
    assert not torch.equal(perms[0], perms[1])
    values = str(spec.params.model_dump())
    seeds = {v for v in values.replace(",", " ").replace("}", " ").replace(":", " ").split() if v.isdigit()}
    for seed in seeds:
        seeded = torch.randperm(len(original), generator=torch.Generator().manual_seed(int(seed)))
        assert not any(torch.equal(seeded, perm) for perm in perms)
    config = (run.workspace / "large_model" / "config.json").read_text()
    assert "seed" not in config and "perm" not in config.replace("permuted", "")
    assert sorted(p.name for p in (run.workspace / "large_model").iterdir()) == ["config.json",
                                                                                  "model.safetensors"]
    # the starting score stays that of a permuted model: over 8 permutations the mini start scored
    # 2.155 ± 0.028 (the calibrated start, one fixed permutation, is 2.1553)
    raws = [scorer.score(spec, r.workspace, r.protected).raw for r in (run, other)]
    assert all(raw is not None and abs(raw - spec.default_constants.start) < 0.15 for raw in raws), raws


def test_errors_on_heldout_text_give_a_fixed_message(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    from openrebench.environments.fix_embedding import scorer

    def failing(*args: object, **kwargs: object) -> float:
        raise IndexError("index 3141 is out of bounds: held-out token at position 2718")

    monkeypatch.setattr(scorer, "evaluate", failing)
    result = scorer.score(get_environment("fix_embedding").tier("mini"), run.workspace, run.protected)
    assert result.raw is None and result.message == scorer.HELDOUT_FAILURE
    assert "3141" not in result.model_dump_json() and "2718" not in result.model_dump_json()
