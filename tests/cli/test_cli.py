"""The `openrebench` command: listing, errors as one clear line, and the mini path end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from openrebench.api import Direction
from openrebench.cli import app
from openrebench.runs import Run, final_score

runner = CliRunner()


def invoke(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


def test_list_and_info_show_the_kernel_environment() -> None:
    code, out = invoke("list")
    assert code == 0 and "optimize_kernel" in out and "ai_rd_triton_cumsum" in out
    code, out = invoke("info", "optimize_kernel")
    assert code == 0
    assert "tier mini" in out and "tier full" in out and "RE-Bench paper" in out
    # whether an attempt gets a disk of its own here, and its size (16 GB: four times a 4 GB workspace)
    from openrebench.isolation import volume_problem

    text = " ".join(out.split())
    assert ("16 GB of its own" in text) if volume_problem() is None else ("none here" in text), text
    code, out = invoke("info", "rust_codecontests")  # its mini tier cuts the offline model's replies
    text = " ".join(out.replace("│", " ").split())
    assert code == 0
    from openrebench.runs import get_environment

    cap = get_environment("rust_codecontests").tier("mini").model_budget.reply_tokens
    assert f"2,000,000 tokens per run; each reply of the tier's own models at most {cap} tokens" in text
    assert "$500 per run" in text and text.count("each reply") == 1  # the full tier's model is not cut


@pytest.mark.parametrize(("args", "message"), [
    (("info", "nope"), "error: unknown environment 'nope' (known: chat_rl, "),
    (("start", "nope", "RUN"), "error: unknown environment 'nope'"),
    (("start", "optimize_kernel", "--tier", "huge", "RUN"), "error: unknown tier 'huge' for optimize_kernel"),
    (("score", "MISSING"), "does not exist"),
    (("log", "MISSING"), "does not exist"),
    (("result", "NOTARUN"), "is not an openrebench run"),
    (("calibrate", "optimize_kernel", "--tier", "huge"), "error: unknown tier 'huge'"),
])
def test_bad_input_gives_one_clear_line(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    (tmp_path / "NOTARUN").mkdir()
    args = tuple(str(tmp_path / a) if a in ("RUN", "MISSING", "NOTARUN") else a for a in args)
    code, out = invoke(*args)
    assert code == 1
    assert message in out
    assert len(out.strip().splitlines()) == 1 and "Traceback" not in out
    assert not (tmp_path / "RUN").exists()


def test_start_refuses_a_non_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    code, out = invoke("start", "optimize_kernel", str(tmp_path))
    assert code == 1 and "already exists and is not an empty directory" in out
    assert (tmp_path / "keep.txt").read_text() == "mine"


def test_malformed_run_file_is_reported(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text("{not json")
    code, out = invoke("log", str(tmp_path))
    assert code == 1 and "is not a valid run file" in out


@pytest.mark.slow
def test_mini_path_start_reference_score_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The commands of docs/runs.md as written, with their relative run directory."""
    monkeypatch.chdir(tmp_path)
    run_dir = Path("runs/k1")
    code, out = invoke("start", "optimize_kernel", "--tier", "mini", str(run_dir))
    assert code == 0, out
    assert "Optimize a kernel" in out and "Workspace:" in out
    run = Run.open(run_dir / "workspace")  # any folder inside the run finds it
    info = json.loads((run_dir / "run.json").read_text())
    assert info["env_id"] == "optimize_kernel" and info["tier"] == "mini" and info["hardware"]["torch"]
    (setup,), _ = run.rows()
    assert setup.kind == "setup" and not setup.charged and setup.valid
    assert setup.normalised is not None and setup.normalised <= 0.2, setup  # the start is ~0, within noise

    from openrebench.runs import install_reference

    install_reference(run)
    # Scored twice, as an agent would: the run's final score is its best row, which absorbs a single
    # scoring slowed down by a busy machine (the mini reference's spread is ~10%, benchmarks/README.md).
    for _ in range(2):
        code, out = invoke("score", str(run_dir))
        assert code == 0 and "Valid:" in out, out
    rows, _ = run.rows()
    assert all(r.charged and r.normalised is not None and r.normalised > 0.4 for r in rows[1:]), rows
    _, normalised = final_score(rows, Direction.MIN, run.info.constants)
    assert normalised >= 0.6, rows  # ≈ 0.95 on a quiet machine; timing on a busy one costs some of it

    code, out = invoke("log", str(run_dir))
    assert code == 0 and "setup (free)" in out
    code, out = invoke("result", str(run_dir))
    assert code == 0 and f"normalised: {normalised:.3f}" in out


@pytest.mark.slow
def test_calibrate_writes_a_record_that_new_runs_use(tmp_path: Path) -> None:
    from openrebench.api import cache_dir
    from openrebench.runs import Run as RunClass
    from openrebench.runs import get_environment

    code, out = invoke("calibrate", "optimize_kernel", "--tier", "mini", "--repeats", "1",
                       "--out", str(tmp_path / "records"))
    assert code == 0, out
    assert "CV" in out and "median" in out
    records = list((cache_dir() / "calibration" / "optimize_kernel").glob("mini--cpu-*.json"))
    assert len(records) == 1
    record = json.loads(records[0].read_text())
    assert len(record["start"]["values"]) == 1 and len(record["reference"]["values"]) == 1
    assert record["reference"]["median"] < record["start"]["median"]  # ln(ms): the reference is faster
    assert (tmp_path / "records" / records[0].name).exists()
    run = RunClass.create(get_environment("optimize_kernel"), "mini", tmp_path / "run")
    assert run.info.constants.source.startswith("local calibration on cpu:")
    assert run.info.constants.start == record["start"]["median"]


def test_the_log_table_shows_each_message_s_first_clause() -> None:
    from openrebench.cli._common import first_clause

    message = "Valid: correct on 8 inputs; median 7.9 ms over 20 calls"
    assert first_clause(message) == "Valid: correct on 8 inputs …"
    assert first_clause("Invalid: wrong output\ndetails") == "Invalid: wrong output"
    assert len(first_clause("x" * 500)) == 120 and first_clause("") == ""


def test_eval_help_lists_the_agents_and_isolations_the_harness_registers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import openrebench.harness

    monkeypatch.setattr(openrebench.harness, "AGENTS", (*openrebench.harness.AGENTS, "toy_agent"))
    monkeypatch.setattr(openrebench.harness, "ISOLATIONS", (*openrebench.harness.ISOLATIONS, "toy_box"))
    monkeypatch.setenv("COLUMNS", "200")
    code, out = invoke("eval", "--help")
    assert code == 0, out
    assert "aide, human, modular, oracle (no model), react or toy_agent." in out
    assert ("auto (an isolating sandbox (bwrap), else an error naming what is missing), bwrap, none (no "
            "isolation at all: only by name, marked UNISOLATED in the results), or toy_box.") in " ".join(
        line.strip(" │") for line in out.splitlines())


def test_scoring_from_inside_the_workspace_imports_nothing_of_the_agent(tmp_path: Path) -> None:
    """`cd runs/k1/workspace && openrebench score` (as docs/runs.md writes it): modules the agent left in
    its workspace, named like the harness's own imports, must not run in the harness process (the harness
    is the same for every environment: scaling_law's scoring takes a second, optimize_kernel's start ten)."""
    import shutil
    import subprocess
    import sys

    from openrebench.runs import start_run

    run = start_run("scaling_law", "mini", tmp_path / "run", score_start=False)[0]
    marker = run.path / "agent-code-ran"
    for name in ("typer", "rich", "pydantic", "openrebench_plugin"):
        (run.workspace / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write('{name}\\n')\n")
    command = shutil.which("openrebench", path=str(Path(sys.executable).parent))
    assert command is not None
    out = subprocess.run([command, "score"], cwd=run.workspace, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert not marker.exists(), f"attack works: {marker.read_text()}"
