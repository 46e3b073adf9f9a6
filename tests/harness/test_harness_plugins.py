"""Agents and sandbox backends are registries: the built-ins are found as modules, a third-party package
adds its own through entry points with no edit to the harness, and a broken plug-in costs a warning,
not the built-ins."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

import openrebench.harness as harness
from openrebench.base import OpenRebenchError
from openrebench.cli import app
from openrebench.harness import SandboxConfig, TaskArgError, agents, backends, environment_tasks

PLUGIN = textwrap.dedent('''
    """A lab's package: one agent and one sandbox backend."""
    from openrebench.harness import AgentSpec, Backend
    from openrebench.harness.agents.oracle import oracle
    from openrebench.harness.backends import Launch

    AGENT = AgentSpec(name="echo", factory=lambda env, tier, seconds: oracle(), needs_model=True,
                      description="a test agent that needs a model")
    TAKEN = AgentSpec(name="react", factory=lambda env, tier, seconds: oracle(), description="a clash")
    NOT_A_SPEC = object()


    class Fake(Backend):
        name = "fake"
        description = "a test backend that never starts"

        @classmethod
        def unusable(cls):
            return "no fake here"

        def command(self, cmd, cwd=None, env=None, interactive=False):
            return Launch(cmd)

        def login(self):
            return "true"


    class Auto(Fake):
        name = "auto"


    BACKEND = Fake
''')

ENTRY_POINTS = textwrap.dedent("""
    [openrebench.agents]
    echo = toy_lab:AGENT
    react = toy_lab:TAKEN
    broken = toy_lab_missing:AGENT
    odd = toy_lab:NOT_A_SPEC

    [openrebench.sandbox_backends]
    fake = toy_lab:BACKEND
    auto = toy_lab:Auto
""")


@pytest.fixture
def toy_lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """An installed package (a module and its dist-info on sys.path) with an agent and a backend."""
    (tmp_path / "toy_lab.py").write_text(PLUGIN)
    info = tmp_path / "toy_lab-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-lab\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    agents.refresh()
    backends.refresh()
    yield
    agents.refresh()
    backends.refresh()


def test_the_built_ins_are_found_as_modules() -> None:
    assert harness.AGENTS == ("aide", "human", "modular", "oracle", "react")
    assert harness.ISOLATIONS == ("auto", "bwrap", "none")
    assert [a.needs_model for a in agents.agent_specs().values()] == [True, False, True, False, True]
    assert agents.get_agent("react").limits(3600).messages == 300
    assert agents.get_agent("oracle").limits(3600) == harness.Limits()
    assert backends.get_backend("bwrap").sandboxed_scoring and backends.get_backend("bwrap").leases_gpus
    assert backends.get_backend("none").warning and not backends.get_backend("none").sandboxed_scoring


def test_a_plug_in_package_adds_an_agent_and_a_backend(toy_lab: None) -> None:
    with pytest.warns(UserWarning) as caught:
        names = harness.AGENTS
    said = " | ".join(str(w.message) for w in caught)
    assert names == ("aide", "echo", "human", "modular", "oracle", "react")
    assert "'broken' (toy_lab_missing:AGENT) is skipped: ModuleNotFoundError" in said
    assert "'odd' (toy_lab:NOT_A_SPEC) is skipped" in said and "not an openrebench AgentSpec" in said
    assert "the name 'react' is taken by openrebench.harness.agents.react" in said
    assert agents.get_agent("react").needs_model  # the built-in stays

    with pytest.warns(UserWarning, match="toy_lab:Auto.* the name 'auto' is reserved"):
        assert harness.ISOLATIONS == ("auto", "bwrap", "fake", "none")
    assert SandboxConfig(env_id="optimize_kernel", isolation="fake").isolation == "fake"
    with pytest.raises(RuntimeError, match="the fake sandbox cannot start here: no fake here"):
        backends.resolve_isolation("fake")

    task = environment_tasks()["optimize_kernel"](agent="echo", isolation="fake")
    assert task.metadata["agent"] == "echo" and task.message_limit is None


def test_the_cli_and_the_task_read_the_registries(toy_lab: None) -> None:
    with pytest.warns(UserWarning):
        agents.agent_specs()
        backends.backend_classes()
    result = CliRunner().invoke(app, ["eval", "optimize_kernel", "--agent", "echo"])
    assert result.exit_code == 1 and "error: the echo agent needs --model" in result.output, result.output
    result = CliRunner().invoke(app, ["eval", "optimize_kernel", "--isolation", "fake"])
    assert result.exit_code == 1 and "error: --isolation fake: no fake here" in result.output, result.output
    known = r"\(known: aide, echo, human, modular, oracle, react\)"
    with pytest.raises(TaskArgError, match=r"unknown agent 'gpt' " + known):
        environment_tasks()["optimize_kernel"](agent="gpt")


def test_bad_names_give_one_line() -> None:
    known = r"\(known: aide, human, modular, oracle, react\)"
    with pytest.raises(OpenRebenchError, match=r"^unknown agent 'gpt' " + known + "$"):
        agents.get_agent("gpt")
    with pytest.raises(ValidationError, match=r"unknown isolation 'docker' \(known: auto, bwrap, none\)"):
        SandboxConfig(env_id="optimize_kernel", isolation="docker")
    assert backends.isolation_problem("auto") is None and backends.isolation_problem("none") is None
