"""An environment's declared files: how the runs layer places them, and, for every registered
environment's mini tier, that what it declares exists once built, lands where declared, and keeps
protected data out of the workspace."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chat_rl_support import echo_judge_server, judge_access
from openrebench.api import Environment, OpenRebenchError, Placement, RunFiles, file_contents
from openrebench.runs import (
    environment_classes,
    get_environment,
    install_reference,
    place,
    protected_leaks,
    run_files,
    start_run,
)

pytest_plugins = ["lm_support"]


# -- placing -------------------------------------------------------------------------------------------

def test_a_dest_is_a_plain_relative_path_and_an_entry_has_one_source() -> None:
    for bad in ("", ".", "/etc/passwd", "../x", "a/../../x", "a//b", "a/"):
        with pytest.raises(ValueError):
            Placement.text(bad, "x")
    with pytest.raises(ValueError):
        Placement(dest="a")
    with pytest.raises(ValueError):
        Placement(dest="a", source=Path("x"), content=b"x")
    with pytest.raises(ValueError, match="protected"):
        RunFiles(workspace=[Placement.copy(Path("x"), "x", link=True)])
    with pytest.raises(ValueError, match="protected"):
        RunFiles(reference=[Placement.text("x", "x", public=True)])


def test_folders_are_placed_whole_in_order_without_caches(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub" / "__pycache__").mkdir(parents=True)
    (src / "a.py").write_text("a")
    (src / "sub" / "b.sh").write_text("b")
    (src / "sub" / "b.sh").chmod(0o750)
    (src / "sub" / "c.bin").write_text("c")
    (src / "sub" / "c.bin").chmod(0o600)
    (src / "sub" / "__pycache__" / "b.pyc").write_text("cache")
    root = tmp_path / "root"
    written = place([Placement.copy(src, "dir"), Placement.text("dir/a.py", "later wins")], root)
    assert written == ["dir/a.py", "dir/sub/b.sh", "dir/sub/c.bin", "dir/a.py"]
    assert (root / "dir" / "a.py").read_text() == "later wins"
    assert not (root / "dir" / "sub" / "__pycache__").exists()
    # the same modes on every machine: scripts stay executable, everything is readable
    assert [(root / "dir" / n).stat().st_mode & 0o777 for n in ("a.py", "sub/b.sh", "sub/c.bin")] == \
        [0o644, 0o755, 0o644]
    assert dict(file_contents([Placement.copy(src, "d")])) == {"d/a.py": b"a", "d/sub/b.sh": b"b",
                                                               "d/sub/c.bin": b"c"}


def test_a_missing_source_says_the_assets_are_not_built(tmp_path: Path) -> None:
    with pytest.raises(OpenRebenchError, match="not built"):
        place([Placement.copy(tmp_path / "missing", "x")], tmp_path / "root")


def test_placing_replaces_links_and_never_writes_outside(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "target").write_text("keep")
    (root / "file").symlink_to(outside / "target")
    place([Placement.text("file", "new")], root)
    assert (outside / "target").read_text() == "keep" and not (root / "file").is_symlink()
    (root / "dir").symlink_to(outside)
    with pytest.raises(OpenRebenchError, match="outside"):
        place([Placement.text("dir/sub/x", "new")], root)
    assert sorted(p.name for p in outside.iterdir()) == ["target"]


def test_links_are_hard_links_to_the_source(tmp_path: Path) -> None:
    (tmp_path / "big").write_bytes(b"weights")
    place([Placement.copy(tmp_path / "big", "m/big", link=True)], tmp_path / "p")
    assert (tmp_path / "p" / "m" / "big").stat().st_ino == (tmp_path / "big").stat().st_ino


def test_a_protected_file_copied_into_the_workspace_is_found(tmp_path: Path) -> None:
    ws, protected = tmp_path / "ws", tmp_path / "protected"
    place([Placement.text("held/out.bin", "secret tokens"), Placement.text("config", "shared")], protected)
    place([Placement.text("data/copy.bin", "secret tokens"), Placement.text("config", "shared"),
           Placement.text("other", "secret tokenz")], ws)
    assert protected_leaks(ws, protected) == ["config = config", "data/copy.bin = held/out.bin"]
    assert protected_leaks(ws, protected, public={"config"}) == ["data/copy.bin = held/out.bin"]


def test_a_set_up_that_leaks_protected_data_is_refused(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    env = get_environment("optimize_kernel")

    def leaky(self: Environment, tier: str, cache_dir: Path) -> RunFiles:
        return RunFiles(workspace=[Placement.text("solution.py", "# answer: 42\n")],
                        protected=[Placement.text("answer.txt", "# answer: 42\n")])

    monkeypatch.setattr(type(env), "files", leaky)
    with pytest.raises(OpenRebenchError, match=r"into the workspace: solution\.py = answer\.txt"):
        start_run(env, "mini", tmp_path / "run", score_start=False)
    assert not list(tmp_path.iterdir())


def test_per_run_files_are_written_after_the_declared_ones(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    env = get_environment("optimize_kernel")
    seen: list[str] = []

    def write(self: Environment, tier: str, workspace: Path, protected: Path, cache_dir: Path) -> None:
        seen.append(tier)
        assert (workspace / "solution.py").is_file()
        (protected / "secret.bin").write_bytes(b"per run")

    monkeypatch.setattr(type(env), "write_run_files", write)
    run, _ = start_run(env, "mini", tmp_path / "run", score_start=False)
    assert seen == ["mini"]
    assert "secret.bin" in (run.path / "protected_manifest.json").read_text()  # recorded with the rest


# -- every environment's mini tier ---------------------------------------------------------------------

def _shorter(env_id: str, params: Any) -> Any:
    """The same files, built faster: restricted_mlm's two models trained for seconds (as its own tests
    do, so the build is shared), scaling_law's reference procedure on a reduced grid (as its test of
    the procedure), chat_rl's tiny tier (as its own tests). fix_embedding keeps its models, shared with
    its own tests."""
    if env_id == "restricted_mlm":
        return params.model_copy(update={k: {**getattr(params, k), "max_iters": 25, "threads": 1}
                                         for k in ("train_start", "train_reference")})
    if env_id == "chat_rl":
        from chat_rl_support import TINY

        return TINY
    if env_id == "scaling_law":
        return params.model_copy(update={"reference": params.reference.model_copy(
            update={"budget_fractions": [0.02, 0.04, 0.08], "widths": [8, 16], "min_iters": 15})})
    return params


@pytest.fixture(scope="module")
def built_home(lm_home: Path, lm_sources: Path) -> Iterator[Path]:
    """Every registered environment's mini assets, built once into the session's cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENREBENCH_SOURCES", str(lm_sources))
        mp.setenv("OPENREBENCH_HOME", str(lm_home))
        for env_id, cls in environment_classes().items():
            spec = cls.tiers["mini"]
            mp.setitem(cls.tiers, "mini", spec.model_copy(update={"params": _shorter(env_id, spec.params)}))
            get_environment(env_id).build_assets("mini", lm_home)
        yield lm_home


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
@pytest.mark.parametrize("env_id", sorted(environment_classes()))
def test_the_declared_files_exist_land_where_declared_and_protected_ones_stay_out(
        env_id: str, built_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENREBENCH_HOME", str(built_home))
    env = get_environment(env_id)
    with contextlib.ExitStack() as stack:
        access, models = None, None
        if env.builds_with_models:  # its models' assets are built at set-up, against a fake judge here
            access, models = judge_access(stack.enter_context(echo_judge_server())), {"judge": "fake-echo"}
        run, _ = start_run(env, "mini", tmp_path / "run", score_start=False, access=access, models=models)
    files = run_files(run)  # the tier's files and those built for the run's models
    declared = {which: dict(file_contents(getattr(files, which)))
                for which in ("workspace", "protected", "reference")}
    assert declared["workspace"] and declared["reference"], env_id

    public = {dest for p in files.protected if p.public for dest, _ in p.expand()}
    secret = {hashlib.sha256(data).hexdigest(): dest for dest, data in declared["protected"].items()
              if dest not in public and data}
    for dest, data in declared["workspace"].items():  # (the reference may be protected: it is hidden)
        assert hashlib.sha256(data).hexdigest() not in secret, f"{env_id}: {dest} is protected data"

    for which, root in (("workspace", run.workspace), ("protected", run.protected)):
        for dest, data in declared[which].items():
            assert (root / dest).read_bytes() == data, f"{env_id}: {which}/{dest}"
    assert protected_leaks(run.workspace, run.protected, public) == []
    assert not {_digest(f) for f in run.workspace.rglob("*") if f.is_file()} & set(secret)

    assert set(install_reference(run)) == set(declared["reference"])
    for dest, data in declared["reference"].items():
        assert (run.workspace / dest).read_bytes() == data, f"{env_id}: reference {dest}"
