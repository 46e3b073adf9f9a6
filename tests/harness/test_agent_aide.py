"""The aide agent: its tree policy and reply parsing without a sandbox, then one scripted search end to end
through a mini optimize_kernel run (a broken draft, its fix, an improvement to the reference)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from inspect_ai import eval as inspect_eval
from inspect_ai.model import ModelOutput, get_model

from openrebench.api import Direction
from openrebench.harness import environment_tasks
from openrebench.harness.agents import aide, get_agent
from openrebench.harness.agents.aide import Node, Policy, Reply, Search, SearchTree, parse_reply
from openrebench.isolation import bwrap_binary
from openrebench.runs import get_environment

bwrap_needed = pytest.mark.skipif(bwrap_binary() is None, reason="bubblewrap is not available")


def _grow(tree: SearchTree, rng: random.Random, outcomes: list[tuple[bool, float | None]]) -> list[Node]:
    """Nodes made by the policy, each given the next (valid, metric) outcome."""
    made = []
    for valid, metric in outcomes:
        operator, parent = tree.choose(rng)
        node = tree.add(operator, parent)
        node.valid, node.metric = valid, metric if valid else None
        made.append(node)
    return made


def test_the_policy_drafts_first_then_debugs_buggy_leaves_to_a_bounded_depth_then_improves() -> None:
    policy = Policy(num_drafts=2, debug_prob=1.0, max_debug_depth=2)
    tree = SearchTree(Direction.MIN, policy, start_metric=5.0)
    nodes = _grow(tree, random.Random(0), [(False, None), (False, None), (False, None), (False, None),
                                           (False, None), (False, None), (True, 4.0)])
    assert [n.operator for n in nodes[:2]] == ["draft", "draft"]
    # Each buggy draft is debugged at most twice in a row, then the best node is improved.
    debugs = [n for n in nodes if n.operator == "debug"]
    assert len(debugs) == 4 and max(n.debug_depth for n in debugs) == 2
    assert nodes[-1].operator == "improve" and nodes[-1].parent == 0  # the start: the only valid node
    assert tree.best() is nodes[-1]


def test_improve_follows_the_best_node_by_direction() -> None:
    for direction, best_metric in ((Direction.MIN, 1.0), (Direction.MAX, 9.0)):
        tree = SearchTree(direction, Policy(num_drafts=3, debug_prob=0.0), start_metric=5.0)
        _grow(tree, random.Random(1), [(True, 9.0), (True, 1.0), (True, 5.0)])
        assert tree.best().metric == best_metric
        operator, parent = tree.choose(random.Random(1))
        assert operator == "improve" and parent is tree.best()
    hidden = SearchTree(Direction.LAST, Policy(num_drafts=3, debug_prob=0.0))  # scores hidden: the latest
    nodes = _grow(hidden, random.Random(2), [(True, None), (True, None), (False, None)])
    assert hidden.best() is nodes[1]


def test_the_search_stops_at_its_node_cap_time_and_format_failures() -> None:
    box: Any = SimpleNamespace(config=SimpleNamespace(time_limit_s=3600.0), working_time_s=lambda: 100.0,
                               run=SimpleNamespace(rows=lambda: ([], None)))
    env: Any = SimpleNamespace(direction=Direction.MIN, score_visible=True)
    state: Any = SimpleNamespace(messages=[])
    search = Search(box, env, state, Policy.for_time(3600), 3600)
    assert search.policy.max_nodes == aide.NODES_PER_HOUR and search.policy.num_drafts == 2
    assert search.stop_reason() is None
    for _ in range(aide.FAILURES_IN_A_ROW):
        search.tree.add("improve", search.tree.best()).failed_reply = True
    assert "without a usable solution" in (search.stop_reason() or "")
    search.tree.add("draft", None).seconds = 600.0  # a slow node: one more would not fit in the time left
    box.working_time_s = lambda: 3000.0
    assert "working time" in (search.stop_reason() or "")
    box.working_time_s = lambda: 0.0
    search.tree.nodes[1:] = [Node(i + 1, "draft", seconds=1.0) for i in range(search.policy.max_nodes)]
    assert "nodes made" in (search.stop_reason() or "")


class FakeBox:
    """The sandbox calls a search makes, over a dict of workspace files; every scoring is valid."""

    def __init__(self, files: dict[str, str]) -> None:
        self.files = dict(files)
        self.config = SimpleNamespace(time_limit_s=3600.0)
        self.run = SimpleNamespace(rows=lambda: ([], None))
        self.scorings = 0

    def working_time_s(self) -> float:
        return 0.0

    def time_up(self) -> None:
        return None

    async def read_file(self, file: str, text: bool = True) -> str:
        if file.endswith("/folder"):
            raise IsADirectoryError(file)
        if file not in self.files:
            raise FileNotFoundError(file)
        return self.files[file]

    async def write_file(self, file: str, contents: str) -> None:
        self.files[file] = contents

    async def exec(self, cmd: list[str], **kwargs: Any) -> Any:
        if cmd[:2] == ["rm", "-f"]:
            self.files.pop(cmd[2], None)
        failed = cmd[0] == "bash" and "exit 1" in cmd[2]
        return SimpleNamespace(success=not failed, returncode=int(failed), stdout="", stderr="boom")

    async def score(self) -> Any:
        self.scorings += 1
        return SimpleNamespace(valid=True, raw=1.0, details={})

    def describe(self, row: Any) -> str:
        return "Valid"


def test_nodes_switch_the_workspace_and_bad_nodes_are_invalid_without_a_scoring() -> None:
    asyncio.run(_switch_nodes())


async def _switch_nodes() -> None:
    box: Any = FakeBox({"/workspace/solution.py": "start\n"})
    env: Any = SimpleNamespace(direction=Direction.MIN, score_visible=True)
    search = Search(box, env, SimpleNamespace(messages=[]), Policy(), 3600)
    first = search.tree.add("draft", None)
    first.files = {"solution.py": "one\n", "helper.py": "h\n"}
    await search.evaluate(first)
    assert first.valid and box.files == {"/workspace/solution.py": "one\n", "/workspace/helper.py": "h\n"}
    await search.materialise(search.tree.nodes[0])  # back to the start: the new file goes, the old returns
    assert box.files == {"/workspace/solution.py": "start\n"}
    failing = search.tree.add("improve", first)
    failing.command = "exit 1"
    await search.evaluate(failing)
    assert not failing.valid and "exit status 1" in failing.feedback and box.scorings == 1
    folder = search.tree.add("debug", failing)
    folder.files["folder"] = "x"
    await search.evaluate(folder)
    assert not folder.valid and "folder: cannot be replaced" in folder.feedback
    assert "folder" not in folder.files and box.scorings == 1  # its debug would not inherit the path


def test_replies_name_their_files_or_say_why_not() -> None:
    files = ["solution.py", "data/notes.txt"]
    text = "Plan: vectorise.\n```python solution.py\nA = 1\n```\n```bash\npython -c 1\n```"
    reply = parse_reply(text, files)
    assert reply == Reply("Plan: vectorise.", {"solution.py": "A = 1\n"}, "python -c 1")
    named = parse_reply("```\n# path: /workspace/lib/helper.py\nB = 2\n```", files)
    assert isinstance(named, Reply) and named.files == {"lib/helper.py": "B = 2\n"}
    unnamed = parse_reply("```python\nC = 3\n```", files)  # the workspace's one Python file
    assert isinstance(unnamed, Reply) and unnamed.files == {"solution.py": "C = 3\n"}
    assert "does not name its file" in str(parse_reply("```python\nC = 3\n```", [*files, "other.py"]))
    assert "inside /workspace" in str(parse_reply("```python ../escape.py\nD = 4\n```", files))
    assert "no complete fenced code block" in str(parse_reply("I am done.", files))
    assert "cut off" in str(parse_reply("```python solution.py\nE = ", files))


def test_aide_is_registered_as_a_model_agent_without_an_idle_stop() -> None:
    spec = get_agent("aide")
    limits = spec.limits(7200)
    assert spec.needs_model and limits.messages and limits.tokens and limits.idle_turns is None


def _reply(plan: str, code: str) -> ModelOutput:
    return ModelOutput.from_content("mockllm/model", f"{plan}\n\n```python solution.py\n{code}```\n")


@pytest.mark.slow
@bwrap_needed
def test_a_scripted_search_debugs_a_broken_draft_improves_and_leaves_the_best(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = get_environment("example_fit")  # the example plug-in: a scoring takes a second
    start = (env.root / "starting" / "solution.py").read_text()
    reference = (env.root / "reference" / "solution.py").read_text()
    monkeypatch.setattr(aide, "DEBUG_PROB", 1.0)  # the buggy draft is debugged, not passed over
    outputs = [
        _reply("Draft: a first attempt.", "def predict(xs):\n    raise RuntimeError('draft bug')\n"),
        _reply("Debug: go back to the training mean.", start),
        _reply("Improve: a least-squares polynomial.", reference),
        *[ModelOutput.from_content("mockllm/model", "I have nothing to add.")] * aide.FAILURES_IN_A_ROW,
    ]
    model = get_model("mockllm/model", custom_outputs=outputs)
    task = environment_tasks()["example_fit"](tier="mini", agent="aide", time_limit=600,
                                              runs_dir=str(tmp_path / "runs"))
    (log,) = inspect_eval(task, model=model, log_dir=str(tmp_path / "logs"), display="none")
    assert log.status == "success", log.error
    (sample,) = log.samples
    assert sample.error is None and sample.limit is None
    said = [m.text for m in sample.messages if m.role == "assistant"]
    assert said[0].startswith("#1 (draft): invalid") and "draft bug" in said[0], said
    assert said[1].startswith("#2 (debug of #1): valid"), said
    assert said[2].startswith("#3 (improve of #"), said
    assert "5 replies in a row without a usable solution" in said[-2], said
    assert said[-1].startswith("Best solution: #3"), said
    score = sample.scores["rebench_scorer"]
    rows = score.metadata["score_log"]
    assert [r["kind"] for r in rows] == ["setup", "score", "score", "score"]
    assert rows[1]["raw"] is None and rows[2]["raw"] is not None
    assert rows[3]["normalised"] == pytest.approx(1.0) and score.value == pytest.approx(1.0)
    workspace = Path(score.metadata["run_dir"]) / "workspace"
    assert (workspace / "solution.py").read_text() == reference
