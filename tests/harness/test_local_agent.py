"""The react agent on the offline default model, end to end and for real: no fake server.

`--model local` starts the shared llama.cpp server (Gemma 3 270M), Inspect's `openai-api` provider talks
to it over HTTP, the agent runs one mini attempt under the shortest working time the CLI takes, and
`analyze` reads the cost from the real usage in the log. A 270M base model solves nothing; what is
checked is the path: model calls made, usage and cost recorded, the attempt ended cleanly by a limit
or the agent, the run scored, and the server gone afterwards.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from openrebench.cli import app
from openrebench.gateway import LOCAL_INSPECT_MODEL
from openrebench.harness._limits import IDLE_KEY, IDLE_TURNS
from openrebench.isolation import bwrap_binary

pytest.importorskip("openai")
pytestmark = pytest.mark.slow



def _is_local_server(p: psutil.Process) -> bool:
    try:
        return "openrebench.gateway._local" in " ".join(p.cmdline())
    except psutil.Error:  # gone, or a zombie another test left: not a running server
        return False

def test_react_on_the_offline_model_records_real_usage_at_zero_cost(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from inspect_ai.log import list_eval_logs, read_eval_log

    from openrebench.cli import _common

    monkeypatch.setattr(_common.console, "width", 250)
    for name in ("LOCAL_BASE_URL", "LOCAL_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    logs, runs = tmp_path / "logs", tmp_path / "runs"
    result = CliRunner().invoke(app, [
        "eval", "example_fit", "--tier", "mini", "--agent", "react", "--model", "local",
        "--time-limit", "60s", "--isolation", "auto" if bwrap_binary() else "none", "--display", "none",
        "--log-dir", str(logs), "--runs-dir", str(runs)], terminal_width=250)
    assert "LOCAL_BASE_URL" not in os.environ
    # The last user left: the server stopped (and was reaped).
    assert not [p for p in psutil.Process().children(recursive=True) if _is_local_server(p)]
    assert result.exit_code == 0, result.output  # every attempt scored
    model = LOCAL_INSPECT_MODEL
    assert f"{model} runs locally (no per-token price)" in result.output

    (info,) = list_eval_logs(str(logs))
    log = read_eval_log(info)
    assert log.status == "success"
    (sample,) = log.samples or []
    assert sample.error is None
    calls = [e for e in sample.events if e.event == "model"]
    assert [e for e in calls if e.error is None], "no model call completed"
    assert {e.error for e in calls} <= {None, "Cancelled by limit"}  # only the one the limit cut short
    usage = sample.model_usage[model]
    assert usage.input_tokens > 0 and usage.output_tokens > 0 and usage.total_cost == 0.0
    # What the model did (2026-12-01, 2-core CPU under a test suite's load): it never called a tool; it
    # wrote 256 tokens of prose each turn (stop reason max_tokens), so after three such turns (21.5, 13.6
    # and 11.6 s) react's idle stop ended the attempt at 47 s of working time. Model time is working
    # time: with replies of 1024 tokens the first call was still generating at 60 s and the working
    # limit cancelled it. So the attempt ends cleanly by either, within the limit.
    ended = sample.limit.type if sample.limit else f"idle {sample.store.get(IDLE_KEY)}"
    assert ended in ("working", f"idle {IDLE_TURNS}"), (ended, sample.output)
    assert sample.working_time is not None and sample.working_time < 60 + 15, sample.working_time
    score = sample.scores["rebench_scorer"]
    run_dir = Path(score.metadata["run_dir"])
    assert (run_dir / "score_log.jsonl").is_file()
    assert score.metadata["score_log"][0]["kind"] == "setup"

    # analyze: the agent's cost from the log's real usage, $0.00 and not unknown.
    out = CliRunner().invoke(app, ["analyze", str(logs), "--json", "--boots", "20", "--sims", "20"])
    assert out.exit_code == 0, out.output
    (group,) = json.loads(out.output)["groups"]
    assert group["cost_per_run_usd"] == 0.0 and group["tokens_per_run"] > 0
    assert group["env_cost_per_run_usd"] is None  # example_fit calls no model of its own
