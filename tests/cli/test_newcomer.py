"""What a newcomer meets first: relative paths, set-up that fails cleanly, hardware checked up front,
calibration records found on the CPU they were measured on, and failures said to be whose they are."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from openrebench.api import OpenRebenchError
from openrebench.cli import app
from openrebench.runs import (
    Hardware,
    Run,
    _calibration,
    _hardware,
    _run,
    environment_classes,
    get_environment,
    start_run,
)
from openrebench.runs import _scoring as scoring
from openrebench.runs._calibration import CalibrationRecord, Stats, constants_for
from openrebench.runs._hardware import model_key

runner = CliRunner()


def _no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu_only = _hardware.detect_hardware().model_copy(update={"gpu_count": 0, "gpu_model": None})
    monkeypatch.setattr(_run, "detect_hardware", lambda: cpu_only)


# -- paths -------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_demo_with_its_default_relative_directory_scores_both_solutions(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["demo", "optimize_kernel"])
    assert result.exit_code == 0, result.output
    (run_dir,) = (tmp_path / "runs").iterdir()
    rows, _ = Run.open(run_dir).rows()
    assert [r.kind for r in rows] == ["setup", "score"] and all(r.valid for r in rows), rows
    assert "infrastructure" not in result.output


def test_a_relative_run_directory_is_made_absolute_once(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    run, _ = start_run("optimize_kernel", "mini", Path("runs/k1"), score_start=False)
    assert run.path == tmp_path / "runs" / "k1" and run.protected.is_absolute()
    monkeypatch.setenv("OPENREBENCH_HOME", "cache")
    from openrebench.api import cache_dir

    assert cache_dir() == tmp_path / "cache"


# -- set-up ------------------------------------------------------------------------------------------

def test_a_failed_set_up_leaves_nothing_and_the_same_start_then_works(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = get_environment("optimize_kernel")

    def broken(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(type(env), "files", broken)
    with pytest.raises(KeyboardInterrupt):
        start_run("optimize_kernel", "mini", tmp_path / "runs" / "k1", score_start=False)
    assert list((tmp_path / "runs").iterdir()) == []  # no half-made run, no hidden leftovers
    monkeypatch.undo()
    run, _ = start_run("optimize_kernel", "mini", tmp_path / "runs" / "k1", score_start=False)
    assert (run.workspace / "solution.py").is_file() and (run.path / "run.json").is_file()


def test_an_existing_directory_is_refused_with_what_to_do(tmp_path: Path) -> None:
    start_run("optimize_kernel", "mini", tmp_path / "k1", score_start=False)
    result = runner.invoke(app, ["start", "optimize_kernel", str(tmp_path / "k1")])
    assert result.exit_code == 1
    line = " ".join(result.output.split())
    assert "already exists and is a run" in line and "rm -r" in line and "Traceback" not in line


def test_the_full_tier_without_a_gpu_stops_before_building(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    _no_gpu(monkeypatch)
    for env_id, cls in environment_classes().items():
        if "full" not in cls.tiers or cls.tiers["full"].device != "cuda":  # (rust_codecontests needs none)
            continue
        with pytest.raises(OpenRebenchError, match=r"needs 1 CUDA GPU.*sees no CUDA GPU.*--tier mini"):
            start_run(env_id, "full", tmp_path / env_id)
        assert not (tmp_path / env_id).exists()
    result = runner.invoke(app, ["start", "optimize_kernel", "--tier", "full", str(tmp_path / "k")])
    assert result.exit_code == 1 and "CUDA GPU" in result.output and "Traceback" not in result.output
    from openrebench.harness import environment_tasks

    monkeypatch.setattr(_hardware, "detect_hardware", _run.detect_hardware)
    with pytest.raises(OpenRebenchError, match="sees no CUDA GPU"):  # `inspect eval -T tier=full`
        environment_tasks()["optimize_kernel"](tier="full")


# -- whose failure -----------------------------------------------------------------------------------

def test_a_scorer_that_cannot_start_is_an_infrastructure_failure(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The relative-path failure of old: the scorer starts in the snapshot, where a relative path to
    the protected folder leads nowhere (bubblewrap, or the scorer without it, cannot find it)."""
    run, _ = start_run("optimize_kernel", "mini", tmp_path / "run", score_start=False)
    solution = tmp_path / "snapshot"
    shutil.copytree(run.workspace, solution)
    monkeypatch.chdir(tmp_path)
    sandboxed = scoring.scoring_sandbox_default()
    if not sandboxed:
        pytest.skip("needs the scoring sandbox (bubblewrap)")
    result = scoring.score_solution("optimize_kernel", "mini", solution, Path("run/protected"), timeout_s=120,
                                memory_limit_gb=4, sandboxed=True)
    assert result.raw is None and result.details["infrastructure"] is True, result
    assert result.message.startswith("Invalid: infrastructure failure (the scorer process")
    assert "not caused by your solution" in result.message and "\n" not in result.message


def test_a_solution_that_ends_the_scorer_is_charged_to_the_solution(tmp_path: Path) -> None:
    """Once the scorer has started, a scorer that dies without a result is the solution's doing."""
    run, _ = start_run("optimize_kernel", "mini", tmp_path / "run", score_start=False)
    (run.workspace / "solution.py").write_text("import os\nos.kill(os.getppid(), 9)\n"
                                               "def prefix_sum(x):\n    return x\n")
    row = scoring.score_run(run, sandboxed=False, timeout_s=120)
    assert row.raw is None and not row.details.get("infrastructure"), row
    assert "infrastructure" not in row.message


def test_start_exits_non_zero_when_the_start_cannot_be_scored(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    def no_scorer(*args: object, **kwargs: object) -> object:
        return scoring.infrastructure_failure("the scoring sandbox could not start: bwrap: no such file")

    monkeypatch.setattr(scoring, "score_solution", no_scorer)
    result = runner.invoke(app, ["start", "optimize_kernel", str(tmp_path / "k1")])
    assert result.exit_code == 1, result.output
    text = " ".join(result.output.split())
    assert "infrastructure failure, not the solution's" in text and "score_log.jsonl" in text
    assert "could not be scored" in text and "Traceback" not in text


# -- calibration keys --------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "key"), [
    ("Intel(R) Xeon(R) Processor @ 2.00GHz", "Intel Xeon"),
    ("Intel(R) Xeon(R) Processor", "Intel Xeon"),
    ("Intel(R) Core(TM) i7-8650U CPU @ 1.90GHz", "Intel Core i7-8650U"),
    ("AMD EPYC 7763 64-Core Processor", "AMD EPYC 7763"),
    ("NVIDIA H200", "NVIDIA H200"),
])
def test_model_names_lose_their_clock_and_trademarks(name: str, key: str) -> None:
    assert model_key(name) == key


def test_a_record_measured_with_a_clock_in_the_name_matches_the_same_cpu_without(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = get_environment("optimize_kernel")
    here = _hardware.detect_hardware()
    measured = here.model_copy(update={"cpu_model": "Intel(R) Xeon(R) Gold 6342 CPU @ 2.80GHz"})
    record = CalibrationRecord(
        env_id=env.id, env_version=env.version, tier="mini", hardware=measured,
        hardware_key="cpu:Intel(R) Xeon(R) Gold 6342 CPU @ 2.80GHz",  # as written before keys were normalised
        start=Stats.of([5.0]), reference=Stats.of([2.0]), measured_at="2026-01-01T00:00:00Z",
        command="openrebench calibrate", package_version="0")
    folder = _calibration.user_calibration_dir(env.id)
    folder.mkdir(parents=True)
    (folder / "mini--cpu-intel-r-xeon-r-gold-6342-cpu-2-80ghz.json").write_text(record.model_dump_json())
    (folder / "mini--broken.json").write_text("{not json")
    for model in ("Intel(R) Xeon(R) Gold 6342 CPU", "Intel Xeon Gold 6342 CPU @ 3.10GHz"):
        hardware = measured.model_copy(update={"cpu_model": model})
        constants = constants_for(env, "mini", hardware)
        assert (constants.start, constants.reference) == (5.0, 2.0) and constants.source.startswith("local")
    other = constants_for(env, "mini", measured.model_copy(update={"cpu_model": "AMD EPYC 7763"}))
    assert other.start != 5.0


def test_every_shipped_mini_record_is_found_on_the_cpu_it_names() -> None:
    for env_id in environment_classes():
        env = get_environment(env_id)
        for path in (env.root / "calibration").glob("mini--*.json"):
            record = json.loads(path.read_text())
            hardware = Hardware.model_validate(record["hardware"])
            source = constants_for(env, "mini", hardware).source
            assert source.startswith("shipped calibration"), (env_id, path.name, source)


# -- the commands the instructions name --------------------------------------------------------------

COMMANDS = ("score", "python", "python3", "bash", "sh", "openrebench", "inspect", "pip", "make")


def _commands(text: str) -> list[str]:
    spans = [s.strip() for s in re.findall(r"`([^`\n]+)`", text)]
    return [s for s in spans if s.split()[0] in COMMANDS]


def test_every_command_the_instructions_name_works_in_the_agent_sandbox(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from openrebench.api import ScoreResult
    from openrebench.harness._sandbox import OpenRebenchSandbox, SandboxConfig

    # The scorer itself is another test's business (tests/harness/test_sandbox.py): here a quick stand-in, so
    # that `score` is tested from the command through the harness's socket to the score log.
    monkeypatch.setattr(scoring, "score_solution",
                        lambda *a, **k: ScoreResult(raw=1.0, message="Valid: quick"))

    run, _ = start_run("optimize_kernel", "mini", tmp_path / "run", score_start=False)
    named: dict[str, list[str]] = {}
    for env_id in environment_classes():
        env = get_environment(env_id)
        named[env_id] = _commands(env.instructions("mini"))
        if (env.root / "starting").is_dir():
            shutil.copytree(env.root / "starting", run.workspace / env_id)
    assert any("score" in commands for commands in named.values())
    loop = asyncio.new_event_loop()
    box = loop.run_until_complete(OpenRebenchSandbox.for_run(run, SandboxConfig(env_id="optimize_kernel")))
    try:
        def sh(script: str, cwd: str = "/workspace"):
            return loop.run_until_complete(box.exec(["bash", "-c", script], cwd=cwd, timeout=300))

        scored = False
        for env_id, commands in named.items():
            for command in dict.fromkeys(commands):
                words = command.split()
                if words[0] == "score":  # the real thing, once: the harness answers over its socket
                    if not scored:
                        result = sh(command)
                        assert result.success and "Valid: quick" in result.stdout, (env_id, command, result)
                    scored = True
                elif words[0] in ("python", "python3", "bash", "sh"):
                    # The script is there, its interpreter runs it, and it takes the options named.
                    # (Running it needs the environment's data: that is its own tests' business.)
                    script = words[1]
                    check = (f"{words[0]} -c 'compile(open(\"{script}\").read(), \"{script}\", \"exec\")'"
                             if words[0].startswith("python") else f"{words[0]} -n {script}")
                    result = sh(check, cwd=f"/workspace/{env_id}")
                    assert result.success, (env_id, command, result)
                    source = (run.workspace / env_id / script).read_text()
                    for option in re.findall(r"--\w+", command):
                        assert option in source or option.replace("_", "-") in source, (env_id, command)
                else:
                    pytest.fail(f"{env_id}'s instructions name `{command}`, which the sandbox does not have")
        assert "#0" in sh("score log").stdout
    finally:
        loop.run_until_complete(box.close())
        loop.close()
