"""The model gateway as a run sees it: a toy environment whose tier declares a `judge` role (default
`mockllm/model`), installed as a plug-in package in a temporary folder, reached from inside a real
bwrap sandbox by the openai package and curl with nothing but OPENAI_BASE_URL and OPENAI_API_KEY, and
by its scorer through the scoring hook; budgets, roles, keys, a backend down, concurrency, a killed
gateway, and the overrides from the CLI and Inspect's task arguments."""

from __future__ import annotations

import asyncio
import json
import shlex
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from inspect_ai.log import list_eval_logs, read_eval_log
from typer.testing import CliRunner

from openrebench.cli import app
from openrebench.gateway import OpenAICompatibleBackend, model_service
from openrebench.gateway._forwarder import exec_prefix
from openrebench.gateway._server import prompt_bound
from openrebench.harness import OpenRebenchSandbox, SandboxConfig, TaskArgError, environment_tasks
from openrebench.isolation import bwrap_usable
from openrebench.runs import Run, refresh, start_run

PACKAGE = "toyjudge_plugin"
SECRETS = {"OPENAI_API_KEY": "sk-secret-harness-openai-0123456789",
           "ANTHROPIC_API_KEY": "sk-ant-secret-harness-9876543210"}
needs_bwrap = pytest.mark.skipif(bwrap_usable() is not None, reason="bubblewrap does not start here")

TOY_ENV = '''
"""toy_judge: write 55 into answer.txt; the scorer asks the run's judge model what it thinks."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from openrebench.api import Direction, Environment, ModelRole, NormConstants, ScoreResult, TierSpec


class ToyJudge(Environment):
    id = "toy_judge"
    rebench_id = "toy_judge"
    title = "Toy: an answer and a judge model"
    version = "0.1.0"
    direction = Direction.MAX
    tiers: ClassVar[dict[str, TierSpec]] = {
        "mini": TierSpec(
            name="mini", description="CPU, instant.", device="cpu", hardware="any CPU",
            time_limit_hours=0.5, score_timeout_s=120, memory_limit_gb=4,
            constants=NormConstants(start=0.0, reference=1.0, source="right or wrong"),
            models={"judge": ModelRole(description="grades the answer", model="mockllm/model")}),
    }

    def score(self, tier: str, solution: Path, protected: Path) -> ScoreResult:
        answer = (solution / "answer.txt").read_text()[:32].strip()
        if not (solution / "ask_judge").exists():
            return ScoreResult(raw=float(answer == "55"), message=f"Valid: answer {answer}.")
        import openai

        reply = openai.OpenAI(max_retries=0, timeout=60).chat.completions.create(
            model="judge", messages=[{"role": "user", "content": f"Is {answer} the sum of 1 to 10?"}])
        return ScoreResult(raw=float(answer == "55"),
                           message=f"Valid: the judge said {reply.choices[0].message.content!r}.")
'''


def write_plugin(root: Path) -> Path:
    package = root / PACKAGE
    for folder, answer in (("starting", "0"), ("reference", "55")):
        (package / folder).mkdir(parents=True)
        (package / folder / "answer.txt").write_text(f"{answer}\n")
    (package / "starting" / "ask_judge").write_text("")
    (package / "__init__.py").write_text('"""A toy environment with a model role."""\n')
    (package / "env.py").write_text(TOY_ENV.lstrip())
    (package / "instructions.md").write_text("Write the sum of 1 to 10 into answer.txt.\n")
    meta = root / f"{PACKAGE}-0.1.0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: toyjudge-plugin\nVersion: 0.1.0\n")
    (meta / "entry_points.txt").write_text("[openrebench.environments]\n"
                                           "toy_judge = toyjudge_plugin.env:ToyJudge\n")
    return root


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = write_plugin(tmp_path_factory.mktemp("site"))
    sys.path.insert(0, str(root))
    refresh()
    try:
        yield root
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(f"{PACKAGE}.")]:
            del sys.modules[name]
        refresh()


@pytest.fixture
def secrets_in_harness(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)


class Box:
    """A sandbox over a fresh toy run, with its own event loop."""

    def __init__(self, path: Path, config: SandboxConfig) -> None:
        self.loop = asyncio.new_event_loop()
        run = start_run("toy_judge", "mini", path, score_start=False)[0]
        self.sandbox = self.loop.run_until_complete(OpenRebenchSandbox.for_run(run, config))
        self.run: Run = run

    def sh(self, script: str, timeout: int = 120) -> Any:
        return self.loop.run_until_complete(self.sandbox.exec(["bash", "-c", script], timeout=timeout))

    def python(self, code: str) -> dict[str, Any]:
        # This interpreter (the sandbox shows it): `python` on the host's PATH may be another.
        result = self.sh(f"{shlex.quote(sys.executable)} -c {shlex.quote(textwrap.dedent(code))}")
        assert result.success, result.stdout + result.stderr
        return json.loads(result.stdout.splitlines()[-1])

    def rows(self) -> list[dict[str, Any]]:
        log = self.run.path / "gateway" / "usage.jsonl"
        return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []

    def close(self) -> None:
        self.loop.run_until_complete(self.sandbox.close())
        self.loop.close()


@pytest.fixture
def open_box(installed: Path, tmp_path: Path, secrets_in_harness: None) -> Iterator[Any]:
    boxes: list[Box] = []

    def make(isolation: str = "bwrap", **config: Any) -> Box:
        box = Box(tmp_path / f"run{len(boxes)}", SandboxConfig(env_id="toy_judge", isolation=isolation,
                                                               **config))
        boxes.append(box)
        return box

    yield make
    for box in boxes:
        box.close()


ASK = """
import json, openai
client = openai.OpenAI(max_retries=0)
def ask(model="judge"):
    try:
        out = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
        return [200, out.choices[0].message.content]
    except openai.APIStatusError as e:
        return [e.status_code, e.message]
"""
# A budget with room for one `ask()` alone: the prompt's bound and the 33 tokens mockllm writes (it ignores
# max_tokens), once; what that answer spends (34 tokens) leaves too little for the next one's worst case.
ONE_ASK = prompt_bound("chat", {"messages": [{"role": "user", "content": "hi"}], "model": "judge"}) + 33


# -- from inside the agent's sandbox ------------------------------------------------------------------

@needs_bwrap
def test_the_openai_package_and_curl_reach_the_granted_role_from_the_sandbox_and_nothing_else(
        open_box: Any) -> None:
    # The role's model as a task argument (`-T judge=...`) would give it; Inspect's mock model by
    # another name here.
    (task,) = [environment_tasks()["toy_judge"](judge="mockllm/judge", isolation="bwrap")]
    config = task.sandbox.config  # type: ignore[union-attr]
    assert dict(config.models) == {"judge": "mockllm/judge"}
    box = open_box(models=config.models)
    seen = box.python(ASK + """
import os
print(json.dumps({"base": os.environ["OPENAI_BASE_URL"], "judge": ask(), "by_name": ask("mockllm/judge"),
                  "other": ask("openai/gpt-4o"), "listed": [m.id for m in client.models.list()]}))
""")
    assert seen["base"] == "http://127.0.0.1:4141/v1"
    assert seen["judge"] == [200, "Default output from mockllm/model"]
    assert seen["by_name"][0] == 200 and seen["listed"] == ["judge"]
    assert seen["other"][0] == 404 and "openai/gpt-4o" in seen["other"][1]
    if shutil.which("curl"):
        body = json.dumps({"model": "judge", "messages": [{"role": "user", "content": "curl"}]})
        out = box.sh(f"curl -sS \"$OPENAI_BASE_URL/chat/completions\" -H \"Authorization: Bearer "
                     f"$OPENAI_API_KEY\" -H 'Content-Type: application/json' -d '{body}'")
        assert json.loads(out.stdout)["choices"][0]["message"]["content"].startswith("Default output"), out
    rows = box.rows()
    assert len(rows) == 3 + bool(shutil.which("curl"))  # one a request (listing models is none)
    assert {r["phase"] for r in rows} == {"agent"} and [r["status"] for r in rows][:3] == [200, 200, 404]
    assert rows[0]["role"] == "judge" and rows[0]["model"] == "mockllm/judge" and rows[2]["role"] is None
    grant = json.loads((box.run.path / "gateway" / "grant.json").read_text())
    assert grant["models"] == {"judge": "mockllm/judge"} and grant["budget"] == {"usd": None, "tokens": None,
                                                                            "reply_tokens": None}
    assert box.sandbox.models.agent_grant.token not in json.dumps(grant) + json.dumps(rows)


@needs_bwrap
def test_no_provider_key_is_visible_in_the_sandbox(open_box: Any) -> None:
    box = open_box()
    token = box.sandbox.models.agent_grant.token
    places = "/run/openrebench /workspace /home/agent /tmp /var/tmp /opt"
    found = box.sh("env; cat /proc/*/environ /proc/*/cmdline 2>/dev/null | tr '\\0' '\\n'; echo ==FILES==; "
                   f"grep -rIh secret {places} 2>/dev/null; ls -A /run/openrebench/gateway")
    assert "gateway.sock" in found.stdout and f"OPENAI_API_KEY={token}" in found.stdout
    for value in SECRETS.values():
        assert value not in found.stdout + found.stderr
    # Not even the name in any process's environment (files may name it: library docs do).
    assert "ANTHROPIC_API_KEY" not in found.stdout.split("==FILES==")[0]


@needs_bwrap
def test_a_spent_budget_is_429_naming_it_and_a_killed_gateway_comes_back_remembering_it(
        open_box: Any) -> None:
    box = open_box(model_budget_tokens=ONE_ASK)  # the first request is let through, the next one is not
    assert box.python(ASK + "print(json.dumps(ask()))")[0] == 200
    refused = box.python(ASK + "print(json.dumps(ask()))")
    assert refused[0] == 429 and "token budget" in refused[1]
    service = model_service()
    restarts = service.restarts
    service.stop()  # as if its thread had died
    assert not service.alive
    # The next command finds it stopped and starts it again, with the run's grant and its spending.
    again = box.python(ASK + "print(json.dumps(ask()))")
    assert service.alive and service.restarts == restarts + 1
    assert again[0] == 429 and "token budget" in again[1]
    rows = box.rows()
    assert [r["status"] for r in rows] == [200, 429, 429] and rows[0]["prompt_tokens"] > 0
    totals = service.current(box.sandbox.models.agent_grant.token).totals()
    assert (totals.requests, totals.failures) == (3, 2)


@needs_bwrap
def test_a_backend_that_is_down_is_503_with_a_clear_message(open_box: Any) -> None:
    model_service().add_backend("test/down", OpenAICompatibleBackend("http://127.0.0.1:9/v1", "down",
                                                                     retries=0))
    box = open_box(models={"judge": "test/down"})
    status, message = box.python(ASK + "print(json.dumps(ask()))")
    assert status == 503 and "the upstream http://127.0.0.1:9/v1 cannot be reached" in message, message
    assert box.rows()[0]["status"] == 503


@needs_bwrap
def test_eight_concurrent_requests_from_the_sandbox_are_all_answered_and_logged(open_box: Any) -> None:
    box = open_box()
    answers = box.python("""
        import asyncio, json, openai
        async def main():
            client = openai.AsyncOpenAI(max_retries=0)
            outs = await asyncio.gather(*(client.chat.completions.create(
                model="judge", messages=[{"role": "user", "content": str(i)}]) for i in range(8)))
            return [o.choices[0].message.content for o in outs]
        print(json.dumps(asyncio.run(main())))
        """)
    assert answers == ["Default output from mockllm/model"] * 8
    rows = box.rows()
    assert len(rows) == 8 and all(r["status"] == 200 and r["phase"] == "agent" for r in rows)


def test_without_isolation_commands_reach_the_model_on_a_free_port_of_the_host(open_box: Any) -> None:
    box = open_box(isolation="none")
    seen = box.python(ASK + "import os\nprint(json.dumps([os.environ['OPENAI_BASE_URL'], ask()]))")
    assert seen[0].startswith("http://127.0.0.1:") and not seen[0].endswith(":4141/v1")
    assert seen[1] == [200, "Default output from mockllm/model"]


# -- the scorer ---------------------------------------------------------------------------------------

@needs_bwrap
def test_the_scorer_calls_the_runs_model_on_a_budget_the_agent_cannot_spend(open_box: Any) -> None:
    box = open_box(model_budget_tokens=ONE_ASK)  # the agent's first request leaves too little
    assert box.python(ASK + "print(json.dumps(ask()))")[0] == 200
    assert box.python(ASK + "print(json.dumps(ask()))")[0] == 429
    (box.run.workspace / "answer.txt").write_text("55\n")
    (box.run.workspace / "ask_judge").write_text("")
    for _ in range(2):  # each scoring has a budget of its own (here the run's limits, afresh)
        row = box.loop.run_until_complete(box.sandbox.score())
        assert row.raw == 1.0 and "Default output from mockllm/model" in row.message, row
    used = row.details["models"]
    assert used["total"]["requests"] == 1 and set(used["phases"]) == {"scoring"}
    assert used["roles"]["judge"]["prompt_tokens"] > 0
    rows = box.rows()
    assert [(r["phase"], r["status"]) for r in rows] == [("agent", 200), ("agent", 429), ("scoring", 200),
                                                         ("scoring", 200)]
    assert rows[2]["grant"] != rows[3]["grant"]
    assert rows[2]["grant"].startswith(f"{box.run.path.name}/scoring-")
    grant = json.loads((box.run.path / "gateway" / "grant.json").read_text())
    assert grant["scoring_budget"]["tokens"] == ONE_ASK
    # The scoring's token is revoked; the agent's alone is live.
    assert list(model_service()._live) == [box.sandbox.models.agent_grant.token]


@needs_bwrap
def test_a_backend_down_during_a_scoring_is_the_harnesss_failure_not_the_solutions(open_box: Any) -> None:
    model_service().add_backend("test/down-scoring", OpenAICompatibleBackend("http://127.0.0.1:9/v1", "down",
                                                                             retries=0))
    box = open_box(models={"judge": "test/down-scoring"})
    (box.run.workspace / "answer.txt").write_text("55\n")
    (box.run.workspace / "ask_judge").write_text("")
    row = box.loop.run_until_complete(box.sandbox.score())
    assert row.raw is None and row.details["infrastructure"] is True
    # In fixed words: a failed call's text can quote its request, and how many failed is the solution's
    # number to choose (tests/redteam/test_message_attacks.py); both are in the hidden details.
    assert row.message.startswith("Invalid: infrastructure failure (the model backend failed during the "
                                  "scoring)"), row.message
    assert "not caused by your solution" in row.message
    failures = row.details["backend_failures"]
    assert (failures["failed"], failures["calls"], failures["first_status"]) == (1, 1, 503), failures
    assert "cannot be reached" in failures["first_error"]
    assert row.details["scored_as"]["raw"] is None  # what the scorer made of it is kept
    assert row.details["models"]["total"]["requests"] == 1


@needs_bwrap
def test_the_agents_socket_is_its_own_and_the_shared_one_is_not_in_the_sandbox(open_box: Any) -> None:
    first, second = open_box(), open_box()
    other = second.sandbox.models.agent_grant.token
    seen = first.python(ASK + f"""
import os
mine = ask()
client = openai.OpenAI(max_retries=0, api_key={other!r})
try:
    client.models.list()
    theirs = 200
except openai.APIStatusError as e:
    theirs = e.status_code
print(json.dumps([mine[0], theirs, sorted(os.listdir("/run/openrebench/gateway"))]))
""")
    assert seen == [200, 401, ["gateway.sock"]]  # another run's token opens nothing on this run's socket
    service = model_service()
    grant = first.sandbox.models.agent_grant
    assert grant.socket_dir is not None and grant.socket_dir != service.socket_dir


# -- choosing models ----------------------------------------------------------------------------------

def test_unknown_roles_and_bad_budgets_are_one_line_errors(installed: Path) -> None:
    from inspect_ai._eval.registry import task_create

    environment_tasks()
    with pytest.raises(TaskArgError) as e:
        task_create("openrebench/toy_judge", jduge="mockllm/model")
    assert "unknown task argument 'jduge'" in str(e.value) and "judge" in str(e.value)
    assert "\n" not in str(e.value)
    with pytest.raises(TaskArgError, match="model_budget_usd must be positive"):
        task_create("openrebench/toy_judge", model_budget_usd=-1)
    task = task_create("openrebench/toy_judge", judge="mockllm/other", model_budget_tokens="20k")
    config = task.sandbox.config  # type: ignore[union-attr]
    assert (dict(config.models), config.model_budget_tokens) == ({"judge": "mockllm/other"}, 20_000)
    assert task.metadata["env_models"] == {"judge": "mockllm/other"}

    runner = CliRunner()
    for args, message in ((["--env-model", "jduge=x"], "no environment chosen has the model role 'jduge'"),
                          (["--env-model", "judge"], "bad --env-model 'judge'")):
        result = runner.invoke(app, ["eval", "toy_judge", *args])
        assert result.exit_code == 1 and message in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1
    info = runner.invoke(app, ["info", "toy_judge"])
    assert info.exit_code == 0 and "judge" in info.output and "mockllm/model" in info.output


def test_a_dollar_budget_needs_a_price_which_prices_gives(installed: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from inspect_ai._eval.registry import task_create

    environment_tasks()
    monkeypatch.setattr(model_service(), "prices", None)
    unpriced = "openai-api/nowhere/unpriced"
    with pytest.raises(TaskArgError, match=f"needs their prices, unknown for {unpriced}"):
        task_create("openrebench/toy_judge", judge=unpriced, model_budget_usd=1)
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({unpriced: {"input": 1.0, "output": 2.0}}))
    # `eval --prices` gives the service the prices before it makes the tasks (a bad file stops it first).
    result = CliRunner().invoke(app, ["eval", "toy_judge", "--prices", str(tmp_path / "none.json"),
                                      "--model-budget-usd", "1"])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
    from openrebench.gateway import load_prices

    monkeypatch.setattr(model_service(), "prices", load_prices(prices))
    task = task_create("openrebench/toy_judge", judge=unpriced, model_budget_usd=1)
    assert task.sandbox.config.model_budget_usd == 1  # type: ignore[union-attr]


@needs_bwrap
def test_env_model_on_the_cli_reaches_the_grant_and_the_usage_reaches_the_log(
        installed: Path, tmp_path: Path, secrets_in_harness: None) -> None:
    result = CliRunner().invoke(app, ["eval", "toy_judge", "--env-model", "judge=mockllm/cli",
                                      "--model-budget-tokens", "50k", "--isolation", "bwrap", "--log-dir",
                                      str(tmp_path / "logs"), "--runs-dir", str(tmp_path / "runs"),
                                      "--display", "none"])
    assert result.exit_code == 0, result.output
    (run_dir,) = (tmp_path / "runs").iterdir()
    grant = json.loads((run_dir / "gateway" / "grant.json").read_text())
    assert grant["models"] == {"judge": "mockllm/cli"} and grant["budget"]["tokens"] == 50_000
    (info,) = list_eval_logs(str(tmp_path / "logs"))
    (sample,) = read_eval_log(info).samples or []
    score = sample.scores["rebench_scorer"]  # type: ignore[index]
    assert score.value == 1.0
    used = score.metadata["gateway_usage"]
    # The set-up scoring and the oracle's: the scorer asked the judge each time, as the role it was given.
    assert used["phases"]["scoring"]["requests"] == 2 and used["models"] == {"mockllm/cli": used["total"]}
    assert all(r["details"]["models"]["total"]["requests"] == 1 for r in score.metadata["score_log"])
    # The agent's own model usage (none: the oracle) is Inspect's; the gateway's is not mixed into it.
    assert not any(k.startswith("mockllm/cli") for k in sample.model_usage)
    # It is in the log as role usage of its own, in the sample and the eval alike.
    judged = sample.role_usage["gateway/judge"]
    assert judged.input_tokens == used["roles"]["judge"]["prompt_tokens"] > 0
    assert judged.total_tokens == used["roles"]["judge"]["tokens"]
    assert read_eval_log(info).stats.role_usage["gateway/judge"].total_tokens == judged.total_tokens


# -- the forwarder's exec mode -------------------------------------------------------------------------

def test_the_exec_forwarder_listens_before_the_command_and_dies_with_it(tmp_path: Path) -> None:
    probe = ("import os, psutil, socket, json; port = int(os.environ['OPENAI_BASE_URL'].split(':')[2]"
             ".split('/')[0]); socket.create_connection(('127.0.0.1', port)).close(); "
             "print(json.dumps([port, [c.pid for c in psutil.Process().children()]]))")
    out = subprocess.run([*exec_prefix(tmp_path / "none.sock", 0), sys.executable, "-c", probe],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    _, (relay,) = json.loads(out.stdout)
    deadline = time.monotonic() + 10
    while True:
        try:
            if psutil.Process(relay).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        assert time.monotonic() < deadline, "the relay outlived its command"
        time.sleep(0.05)
    missing = subprocess.run([*exec_prefix(tmp_path / "none.sock", 0), "no-such-command"],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 127 and "cannot run no-such-command" in missing.stderr


def test_openrebench_start_and_score_give_the_scorer_the_runs_models_sandboxed_or_not(
        installed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    run_dir = tmp_path / "run"
    result = runner.invoke(app, ["start", "toy_judge", str(run_dir)])
    assert result.exit_code == 0 and "the judge said" in result.output, result.output
    monkeypatch.setenv("OPENREBENCH_SCORE_SANDBOX", "0")  # the scorer on the host: a free port there
    result = runner.invoke(app, ["score", str(run_dir)])
    assert result.exit_code == 0 and "the judge said" in result.output, result.output
    rows, _ = Run.open(run_dir).rows()
    assert [r.details["models"]["total"]["requests"] for r in rows] == [1, 1]
    assert rows[1].details["sandboxed"] is False
    grant = json.loads((run_dir / "gateway" / "grant.json").read_text())
    assert grant["models"] == {"judge": "mockllm/model"}


SHELL_PROBE = """
import json, os, sys, openai
client = openai.OpenAI(max_retries=0)
reply = client.chat.completions.create(model="judge", messages=[{"role": "user", "content": "hi"}])
json.dump({"cwd": os.getcwd(), "url": os.environ["OPENAI_BASE_URL"], "key": os.environ["OPENAI_API_KEY"],
           "models": [m.id for m in client.models.list()], "reply": reply.choices[0].message.content},
          open(sys.argv[1], "w"))
sys.exit(3)
"""


def test_openrebench_shell_gives_a_person_the_runs_models_as_an_agent_has_them(
        installed: Path, tmp_path: Path, secrets_in_harness: None) -> None:
    """`openrebench shell RUN -- COMMAND`: the command runs in the workspace with the run's gateway
    (its models by role, the attempt's budget, the usage log's `agent` phase), and its exit code is
    the command's; a run whose tier has no models says so in one line."""
    runner = CliRunner()
    run_dir, out = tmp_path / "run", tmp_path / "probe.json"
    assert runner.invoke(app, ["start", "toy_judge", str(run_dir)]).exit_code == 0
    result = runner.invoke(app, ["shell", str(run_dir), "--", sys.executable, "-c", SHELL_PROBE, str(out)])
    assert result.exit_code == 3, result.output
    seen = json.loads(out.read_text())
    assert seen["cwd"] == str(run_dir / "workspace") and seen["url"].startswith("http://127.0.0.1:")
    assert seen["models"] == ["judge"] and seen["reply"]
    assert seen["key"] not in SECRETS.values()
    usage = [json.loads(line) for line in (run_dir / "gateway" / "usage.jsonl").read_text().splitlines()]
    agent = [r for r in usage if r["phase"] == "agent"]
    assert [(r["grant"], r["role"], r["status"]) for r in agent] == [("run/agent", "judge", 200)]
    other = tmp_path / "plain"
    assert runner.invoke(app, ["start", "scaling_law", str(other)]).exit_code == 0  # scored in a second
    result = runner.invoke(app, ["shell", str(other), "--", "true"])
    assert result.exit_code == 1 and result.output.startswith(
        "error: scaling_law (mini) gives its agent no models: there is no gateway to serve")
