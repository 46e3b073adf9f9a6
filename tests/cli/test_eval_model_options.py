"""`openrebench eval`'s model options (`--max-retries`, `--timeout`, `--max-connections`, `-M`): given to
Inspect as its own, refused in one line when malformed, and enough to end an attempt whose provider
cannot be reached instead of leaving it retrying in silence."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from inspect_ai.log import EvalError
from typer.testing import CliRunner

from openrebench.cli import app
from openrebench.cli._eval import parse_model_args
from openrebench.cli._eval_results import one_line
from openrebench.isolation import bwrap_binary

pytest.importorskip("openai")

MODEL = "openai/gpt-4o-mini"


@pytest.fixture
def dummy_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """A key that lets Inspect make the OpenAI model; nothing here may reach OpenAI with it."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-dummy")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


@pytest.fixture
def fake_inspect(monkeypatch: pytest.MonkeyPatch, dummy_key: None) -> dict[str, Any]:
    """Inspect's `eval` and `eval_set` replaced by recorders: what `openrebench eval` hands them, with
    no attempt run (they return no logs, which the command reports as interrupted)."""
    import inspect_ai

    seen: dict[str, Any] = {}

    def eval_(tasks: Any, **kwargs: Any) -> list[Any]:
        seen.update(tasks=tasks, kwargs=kwargs, via="eval")
        return []

    def eval_set(tasks: Any, **kwargs: Any) -> tuple[bool, list[Any]]:
        seen.update(tasks=tasks, kwargs=kwargs, via="eval_set")
        return True, []

    monkeypatch.setattr(inspect_ai, "eval", eval_)
    monkeypatch.setattr(inspect_ai, "eval_set", eval_set)
    return seen


def _eval(tmp_path: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["eval", "optimize_kernel", "--isolation", "none", "--log-dir",
                                      str(tmp_path / "logs"), "--runs-dir", str(tmp_path / "runs"), *args])
    return result.exit_code, result.output


@pytest.mark.parametrize("resume", [False, True])
def test_the_model_options_reach_inspect_as_its_own(tmp_path: Path, fake_inspect: dict[str, Any],
                                                    resume: bool) -> None:
    _eval(tmp_path, "--agent", "react", "--model", MODEL, "-M", "base_url=http://127.0.0.1:9/v1",
          "--model-arg", "responses_api=false", "-M", "service_tier=flex", "--max-retries", "0",
          "--timeout", "5", "--max-connections", "3", *(["--resume"] if resume else []))
    assert fake_inspect["via"] == ("eval_set" if resume else "eval")
    kwargs = fake_inspect["kwargs"]
    assert kwargs["model"] == MODEL and kwargs["model_base_url"] == "http://127.0.0.1:9/v1"
    assert kwargs["model_args"] == {"responses_api": False, "service_tier": "flex"}  # JSON where it reads
    assert (kwargs["max_retries"], kwargs["timeout"], kwargs["max_connections"]) == (0, 5, 3)


def test_options_not_given_leave_inspects_defaults(tmp_path: Path, fake_inspect: dict[str, Any]) -> None:
    _eval(tmp_path, "--agent", "react", "--model", MODEL)
    assert not {"model_base_url", "model_args", "max_retries", "timeout", "max_connections"} & set(
        fake_inspect["kwargs"])


@pytest.mark.parametrize(("args", "message"), [
    (["-M", "foo"], "error: bad --model-arg 'foo' (use KEY=VALUE, e.g. base_url=http://localhost:8000/v1)"),
    (["-M", "=x"], "error: bad --model-arg '=x' (use KEY=VALUE"),
    (["-M", "a b=1"], "error: bad --model-arg 'a b=1' (use KEY=VALUE"),
    (["-M", "base_url=5"], "error: bad --model-arg base_url=5: give a URL"),
])
def test_a_malformed_model_arg_is_one_line(tmp_path: Path, fake_inspect: dict[str, Any], args: list[str],
                                           message: str) -> None:
    code, out = _eval(tmp_path, "--agent", "react", "--model", MODEL, *args)
    assert code == 1 and out.startswith(message), out
    assert len(out.strip().splitlines()) == 1 and "Traceback" not in out and not fake_inspect


def test_model_args_without_a_model_and_model_options_on_a_cluster_are_refused(
        tmp_path: Path, fake_inspect: dict[str, Any]) -> None:
    code, out = _eval(tmp_path, "-M", "base_url=http://127.0.0.1:9/v1")  # the oracle: no model to make
    assert code == 1 and out.strip() == "error: --model-arg applies to the agent's model: give --model too"
    code, out = _eval(tmp_path, "--agent", "react", "--model", MODEL, "--max-retries", "0", "--timeout", "5",
                      "--cluster", "local")
    assert code == 1 and " ".join(out.split()) == ("error: --cluster does not pass --max-retries, --timeout "
                                                   "to its nodes yet: leave them out or run on one machine")
    assert not fake_inspect


def test_a_campaign_runs_each_environment_at_each_time_limit_and_estimates_them_all(
        tmp_path: Path, fake_inspect: dict[str, Any]) -> None:
    """`--time-limit 30m,2h,8h --epochs k`: the paper's best-of-k at three budgets, one command; the
    analysis reads each attempt's length from its log, so the campaign feeds `analyze` as it is."""
    _, out = _eval(tmp_path, "--agent", "react", "--model", MODEL, "--time-limit", "30m,2h,8h", "--epochs",
                   "2", "--yes")
    tasks = fake_inspect["tasks"]
    assert [t.working_limit for t in tasks] == [1800, 7200, 28800]
    assert all(t.metadata["env_id"] == "optimize_kernel" for t in tasks)
    assert fake_inspect["kwargs"]["epochs"] == 2
    text = " ".join(out.split())
    assert "Estimate: 6 attempts (1 environment × 3 time limits × 2 epochs)" in text
    assert "at most 21 h in all" in text  # 2 × (0.5 + 2 + 8) hours


@pytest.mark.parametrize(("args", "message"), [
    (["--time-limit", "30m,2h,30m"], "error: --time-limit 30m,2h,30m: a time limit is given twice"),
    (["--time-limit", "30m,", "--agent", "oracle"], "error: bad --time-limit '' (use e.g. 90s, 30m, 2h"),
    (["--time-limit", "30m,2h", "--cluster", "local"],
     "error: --cluster runs one --time-limit per campaign: give one, and run the command once per time "
     "limit"),
])
def test_a_malformed_campaign_is_one_line(tmp_path: Path, fake_inspect: dict[str, Any], args: list[str],
                                          message: str) -> None:
    code, out = _eval(tmp_path, *args)
    assert code == 1 and " ".join(out.split()).startswith(message), out
    assert not fake_inspect


def test_model_arg_values_read_as_json_where_they_can() -> None:
    base_url, args = parse_model_args(["base_url=http://h:1/v1", "n=5", "x=1.5", "flag=true", "none=null",
                                       "text=hello", "empty=", "eq=a=b"])
    assert base_url == "http://h:1/v1"
    assert args == {"n": 5, "x": 1.5, "flag": True, "none": None, "text": "hello", "empty": "", "eq": "a=b"}


def test_a_provider_error_behind_inspects_retries_is_named_with_its_cause() -> None:
    """Inspect's retrying (tenacity) ends in a RetryError that names no cause: the line gives the
    provider's exception and the first cause instead."""
    traceback = """Traceback (most recent call last):
  File "httpx/_transports/default.py", line 112, in map_httpcore_exceptions
    raise mapped_exc(message) from exc
httpx.ConnectError: All connection attempts failed

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "openai/_base_client.py", line 1845, in request
    raise APIConnectionError(request=request) from err
openai.APIConnectionError: Connection error.

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "tenacity/__init__.py", line 483, in exc_check
    raise retry_exc from fut.exception()
tenacity.RetryError: RetryError[<Future at 0x7f state=finished raised APIConnectionError>]
"""
    error = EvalError(message="RetryError(<Future at 0x7f state=finished raised APIConnectionError>)",
                      traceback=traceback, traceback_ansi="")
    assert one_line(error) == ("APIConnectionError: Connection error. (ConnectError: All connection "
                                "attempts failed)")


@pytest.fixture
def refusing_port() -> Iterator[int]:
    """A local port that refuses connections: bound (so nothing else takes it) but not listening."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


@pytest.mark.slow
def test_an_unreachable_provider_ends_the_attempt_with_its_error_in_bounded_time(
        tmp_path: Path, refusing_port: int) -> None:
    """Without --max-retries and --timeout, Inspect retries a provider it cannot reach for ever, and the
    eval says nothing. With them the attempt ends with the provider's error, and the log records what
    Inspect was given (a subprocess, so that a regression fails at the bound instead of hanging the suite)."""
    url = f"http://127.0.0.1:{refusing_port}/v1"
    env = {**os.environ, "OPENAI_API_KEY": "sk-dummy", "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}
    env.pop("OPENAI_BASE_URL", None)
    logs = tmp_path / "logs"
    started = time.monotonic()
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "openrebench"), "eval", "example_fit", "--agent", "react",
         "--model", MODEL, "-M", f"base_url={url}", "-M", "responses_api=false", "--max-retries", "0",
         "--timeout", "5", "--max-connections", "2", "--time-limit", "1m", "--display", "none",
         "--isolation", "auto" if bwrap_binary() else "none", "--log-dir", str(logs),
         "--runs-dir", str(tmp_path / "runs")],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    took = time.monotonic() - started
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 1, out[-3000:]
    assert ("error: example_fit (epoch 1): APIConnectionError: Connection error. (ConnectError: All "
            "connection attempts failed)") in out, out[-3000:]
    assert "Traceback" not in out and took < 120
    from inspect_ai.log import list_eval_logs, read_eval_log

    (info,) = list_eval_logs(str(logs))
    spec = read_eval_log(info, header_only=True).eval
    assert spec.model == MODEL and spec.model_base_url == url and spec.model_args == {"responses_api": False}
    config = spec.model_generate_config
    assert (config.max_retries, config.timeout, config.max_connections) == (0, 5, 2)


def test_an_eval_keeps_the_offline_model_only_where_a_role_it_runs_uses_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`eval` holds the offline model for its whole length (`keep_local`) when one of its environments'
    roles uses it on the eval's tier, with the eval's model choices applied; not otherwise."""
    import contextlib
    from types import SimpleNamespace

    from openrebench.cli import _eval
    from openrebench.gateway import _service

    held: list[int] = []

    @contextlib.contextmanager
    def keep(self: Any) -> Iterator[None]:
        held.append(1)
        yield

    monkeypatch.setattr(_service.ModelService, "keep_local", keep)

    def keeps(ids: list[str], env_models: dict[str, dict[str, str]] | None = None) -> bool:
        held.clear()
        plan: Any = SimpleNamespace(ids=ids, tier="mini", env_models=env_models or {})
        with _eval._keeping_local(plan):
            pass
        return bool(held)

    assert keeps(["optimize_kernel", "rust_codecontests"])  # its task model is `local` on mini
    assert not keeps(["optimize_kernel", "scaling_law"])  # no roles at all
    assert not keeps(["rust_codecontests"], {"rust_codecontests": {"task_model": MODEL}})
