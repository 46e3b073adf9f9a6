"""restricted_mlm on the mini tier: the rules at the operator level, the graph the scorer replays, the start
and reference scores, rule-breaking and tampering solutions, and the oracle through Inspect.

The mini assets are built once for the module with shortened training (the scores of the real build are
in the shipped calibration record); the rules themselves are tested in-process, without scoring.
"""

from __future__ import annotations

import math
import os
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from openrebench.api import NormConstants, SolutionProcess
from openrebench.environments.restricted_mlm._graph import (
    Program,
    RuleViolation,
    difference,
    pack_constants,
    trace,
    unpack_constants,
)
from openrebench.environments.restricted_mlm.env import RestrictedMLM
from openrebench.runs import Run, get_environment, score_run, start_run

pytest_plugins = ["lm_support"]

CPU = torch.device("cpu")
V, T, B = 64, 12, 3


@pytest.fixture(scope="module")
def mlm_home(lm_home: Path, lm_sources: Path) -> Iterator[Path]:
    """The mini assets, with training shortened to seconds (the model architectures are the real ones),
    normalised by what these shortened models score (on the 2-core EPYC: start 1.91, reference 0.84 to
    0.86 over three scorings), not by the shipped record of the fully trained ones, so that the oracle's
    reference reads about 1 and the oracle stops after one scoring, as it does on the real tier."""
    spec = RestrictedMLM.tiers["mini"]
    p = spec.params
    # Trained for seconds, on one thread each (the tier's two for the reference wait on a busy machine).
    params = p.model_copy(update={"train_start": {**p.train_start, "max_iters": 25, "threads": 1},
                                  "train_reference": {**p.train_reference, "max_iters": 25, "threads": 1}})
    shortened = NormConstants(start=1.91, reference=0.85, source="the test's shortened models")
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(RestrictedMLM.tiers, "mini", spec.model_copy(
            update={"params": params, "calibration": None, "constants": shortened}))
        mp.setenv("OPENREBENCH_SOURCES", str(lm_sources))
        mp.setenv("OPENREBENCH_HOME", str(lm_home))
        get_environment("restricted_mlm").build_assets("mini", lm_home)
        yield lm_home


@pytest.fixture
def run(mlm_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Run:
    monkeypatch.setenv("OPENREBENCH_HOME", str(mlm_home))
    return start_run("restricted_mlm", "mini", tmp_path / "run", score_start=False)[0]


# ---------------------------------------------------------------- the rules, in-process

def conv1d(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    b, t, c = x.shape
    k = weight.shape[0]
    pad = x.new_zeros(b, k // 2, c)
    padded = torch.cat([pad, x, pad], dim=1)
    s_b, s_t, s_c = padded.stride()
    return torch.einsum("btkc,kcd->btd", padded.as_strided((b, t, k, c), (s_b, s_t, s_t, s_c)), weight)


class Toy(nn.Module):
    def __init__(self, body: Any) -> None:
        super().__init__()
        self.embed = nn.Embedding(V, 8)
        self.head = nn.Linear(8, V)
        self.kernel = nn.Parameter(torch.randn(3, 8, 8))
        self.register_buffer("table", torch.randn(V, 8))
        self.body = body

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self, self.embed(idx), idx))


class Exp(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, a: torch.Tensor) -> torch.Tensor:
        return a.exp()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


class Subclass(torch.Tensor):
    pass


def _catches_its_violation(m: Toy, h: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    try:
        return torch.exp(h)
    except Exception:
        return h


def _switches_tracing_off(m: Toy, h: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    from torch.utils._python_dispatch import _disable_current_modes

    with torch._C.DisableTorchFunction(), _disable_current_modes():
        hidden = torch.softmax(h, dim=-1)  # computed from the input, outside the recording
    return h + hidden


ALLOWED = {
    "as_strided convolution": lambda m, h, idx: F.relu(conv1d(h, m.kernel)) + h,
    "einsum": lambda m, h, idx: torch.einsum("btc,dc->btd", h, m.kernel[0]),
    "matmul, @ and sum": lambda m, h, idx: h @ m.kernel[1] + torch.matmul(h, m.kernel[2]).sum(-1, True),
    "relu, +, * and -": lambda m, h, idx: F.relu(h) * 0.5 - h + 2,
    "gather": lambda m, h, idx: torch.gather(h, 2, torch.zeros_like(h, dtype=torch.long)),
    "table indexed by token ids": lambda m, h, idx: h + F.embedding(idx * 1 + 0, m.table) + m.table[idx],
    "neighbour tokens": lambda m, h, idx: h + m.embed(torch.cat([idx[:, :1], idx[:, :-1]], dim=1)),
    "reshape, unsqueeze, stack, pad": lambda m, h, idx: F.pad(
        torch.stack([h, h]).sum(0).reshape(B, T, 2, 4).unsqueeze(0)[0].flatten(2), (0, 0)),
    "constants and casts": lambda m, h, idx: h + torch.arange(8).float() + torch.ones(8, dtype=torch.float16),
    "repeat_interleave, roll, flip, unfold": lambda m, h, idx: h.repeat_interleave(2, dim=2)[..., ::2]
    + h.roll(1, dims=1).flip(2) + F.pad(h, (0, 0, 1, 1)).unfold(1, 3, 1).sum(-1),
}


@pytest.mark.parametrize("name", list(ALLOWED))
def test_allowed_operations_are_recorded_and_replayed_exactly(name: str) -> None:
    model = Toy(ALLOWED[name]).eval()
    a, b = torch.randint(V, (B, T)), torch.randint(V, (B, T))
    first, second = trace(model, a), trace(model, b)
    packed = pack_constants(first.constants)
    assert difference(first, second, packed, pack_constants(second.constants)) is None
    program = Program(first.nodes, first.output_ref, unpack_constants(*packed, CPU), CPU)
    with torch.no_grad():
        for x, recorded in ((a, first.output), (b, None)):
            replayed = program(x)
            torch.testing.assert_close(replayed, recorded if recorded is not None else model(x))


REJECTED = {
    "softmax": (lambda m, h, idx: F.softmax(h, dim=-1), "torch.nn.functional.softmax (aten._softmax"),
    "division": (lambda m, h, idx: h / 2, "aten.div.Tensor"),
    "torch.exp": (lambda m, h, idx: torch.exp(h), "torch.exp (aten.exp.default)"),
    "getattr": (lambda m, h, idx: getattr(torch, "ex" + "p")(h), "aten.exp.default"),
    "torch.ops": (lambda m, h, idx: torch.ops.aten.exp.default(h), "aten.exp.default"),
    "torch._C": (lambda m, h, idx: torch._C._VariableFunctions.exp(h), "aten.exp.default"),
    "custom autograd Function": (lambda m, h, idx: Exp.apply(h), "aten.exp.default"),
    "numpy round-trip": (lambda m, h, idx: torch.from_numpy(np.tanh(h.numpy())), "torch.Tensor.numpy"),
    "np.asarray": (lambda m, h, idx: torch.as_tensor(np.asarray(h)), "torch.Tensor.__array__"),
    ".item()": (lambda m, h, idx: h * h.sum().item(), "torch.Tensor.item"),
    ".tolist()": (lambda m, h, idx: torch.tensor(h.tolist()), "torch.Tensor.tolist"),
    "printing": (lambda m, h, idx: (print(h), h)[1], "torch.Tensor.__repr__"),
    "mean": (lambda m, h, idx: h - h.mean(-1, keepdim=True), "aten.mean"),
    "layer norm": (lambda m, h, idx: F.layer_norm(h, (8,)), "aten.native_layer_norm"),
    "comparison and where": (lambda m, h, idx: torch.where(h > 0, h, 0.0), "aten.gt"),
    "power": (lambda m, h, idx: h**2, "aten.pow"),
    "conv1d module": (lambda m, h, idx: F.conv1d(h.transpose(1, 2), m.kernel.permute(1, 2, 0), padding=1)
                      .transpose(1, 2), "aten.convolution"),
    "float to integer": (lambda m, h, idx: h + (h * 3).long(), "turns floating-point values into integers"),
    "bits of a float": (lambda m, h, idx: h.view(torch.int32).float(), "aten.view.dtype"),
    "writes a parameter": (lambda m, h, idx: h + m.head.weight.mul_(1.0).sum(), "modifies its input or a"),
    "writes the input": (lambda m, h, idx: h + idx.add_(1).sum(), "modifies its input or a"),
    "tensor subclass": (lambda m, h, idx: h.as_subclass(Subclass), "tensor subclass"),
    "catches the refusal": (_catches_its_violation, "aten.exp.default"),
}


@pytest.mark.parametrize("name", list(REJECTED))
def test_rule_breaking_forward_passes_are_refused_with_the_operation_named(name: str) -> None:
    body, expected = REJECTED[name]
    with pytest.raises(RuleViolation) as caught:
        trace(Toy(body).eval(), torch.randint(V, (B, T)))
    assert expected in str(caught.value)


def test_switching_the_tracing_off_shows_as_a_constant_that_changes_with_the_input() -> None:
    model = Toy(_switches_tracing_off).eval()
    first, second = trace(model, torch.randint(V, (B, T))), trace(model, torch.randint(V, (B, T)))
    problem = difference(first, second, pack_constants(first.constants), pack_constants(second.constants))
    assert problem is not None and "changes with the input" in problem


def _program(nodes: list[dict[str, Any]], constants: list[torch.Tensor] | None = None,
             output: Any = None) -> Program:
    return Program(nodes, output if output is not None else {"n": len(nodes) - 1}, constants or [], CPU)


@pytest.mark.parametrize(("nodes", "expected"), [
    ([{"op": "aten.exp.default", "args": [{"x": 0}], "kwargs": {}}], "forbidden operation: aten.exp.default"),
    ([{"op": "aten.view.dtype", "args": [{"x": 0}, {"dtype": "float64"}], "kwargs": {}}], "forbidden"),
    ([{"op": "os.system", "args": ["true"], "kwargs": {}}], "forbidden operation: os.system"),
    ([{"op": "aten.add.Tensor", "args": [{"n": 0}, {"x": 0}], "kwargs": {}}], "not an earlier one"),
])
def test_the_scorer_refuses_forged_graphs(nodes: list[dict[str, Any]], expected: str) -> None:
    with pytest.raises(RuleViolation, match=expected):
        _program(nodes)(torch.zeros(2, 2, dtype=torch.long))


def test_the_scorer_checks_what_a_forged_graph_does_when_it_runs() -> None:
    x = torch.zeros(2, 2, dtype=torch.long)
    writes = [{"op": "aten.add_.Tensor", "args": [{"c": 0}, 1], "kwargs": {}}]
    with pytest.raises(RuleViolation, match="modifies its input or a constant"):
        _program(writes, [torch.zeros(2)])(x)
    to_int = [{"op": "aten._to_copy.default", "args": [{"c": 0}], "kwargs": {"dtype": {"dtype": "int64"}}}]
    with pytest.raises(RuleViolation, match="into integers"):
        _program(to_int, [torch.ones(2)])(x)
    with pytest.raises(RuleViolation, match="cannot be replayed"):  # a view reaching outside its storage
        unpack_constants([{"s": 0, "dtype": "float32", "size": [100], "stride": [1], "offset": 0}],
                         [b"\0" * 16], CPU)
    unknown = [{"op": "aten.add.Tensor", "args": [{"x": 0}, {"eval": "1"}], "kwargs": {}}]
    with pytest.raises(RuleViolation, match="cannot be replayed"):
        _program(unknown)(x)
    nested: Any = 1
    for _ in range(5000):
        nested = [nested]
    with pytest.raises(RuleViolation, match="nested too deeply"):
        _program([{"op": "aten.add.Tensor", "args": [{"x": 0}, nested], "kwargs": {}}])(x)


# ---------------------------------------------------------------- end to end, mini tier

TINY = textwrap.dedent('''
    import json
    from pathlib import Path

    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch import nn

    VOCAB = json.loads((Path(__file__).parent / "data" / "vocab.json").read_text())


    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB["vocab_size"], 8)
            self.head = nn.Linear(8, VOCAB["vocab_size"])

        def forward(self, idx):
            h = self.embed(idx)
            return self.head(BODY)


    def get_trained_model():
        return Model()
''')

TAMPERING_BODY = textwrap.dedent('''
    def hidden(h):
        from torch.utils._python_dispatch import _disable_current_modes
        with torch._C.DisableTorchFunction(), _disable_current_modes():
            h.copy_(torch.tanh(h))  # changes an intermediate result outside the recording
        return h
''')


def _tiny(body: str) -> str:
    return TINY.replace("BODY", body)


def test_workspace_has_code_weights_and_data_but_not_the_heldout_split(run: Run) -> None:
    ws = run.workspace
    for name in ("solution.py", "train.py", "model.pt", "data/train.bin", "data/val.bin", "data/vocab.json"):
        assert (ws / name).is_file(), name
    assert not list(ws.rglob("heldout*"))
    heldout = (run.protected / "heldout.bin").read_bytes()
    for name in ("train.bin", "val.bin"):
        data = (ws / "data" / name).read_bytes()
        assert heldout[:4096] not in data and heldout[-4096:] not in data


@pytest.mark.slow
@pytest.mark.parametrize(("name", "body", "expected"), [
    ("softmax", "F.softmax(h, dim=-1)", "torch.nn.functional.softmax (aten._softmax.default)"),
    ("division", "h / 2", "aten.div.Tensor"),
    ("torch.exp", "torch.exp(h)", "torch.exp (aten.exp.default)"),
    ("getattr and torch.ops", 'getattr(torch.ops.aten, "ex" + "p").default(h)', "aten.exp.default"),
    ("numpy round-trip", "torch.from_numpy(np.tanh(h.numpy()))", "torch.Tensor.numpy"),
])
def test_rule_breaking_solutions_get_an_invalid_row_naming_the_operation(run: Run, name: str, body: str,
                                                                           expected: str) -> None:
    (run.workspace / "solution.py").write_text(_tiny(body))
    row = score_run(run)
    assert row.raw is None and row.message.startswith("Invalid: "), row.message
    assert expected in row.message and "Allowed in the forward pass" in row.message


@pytest.mark.slow
def test_computing_outside_the_recording_is_detected(run: Run) -> None:
    (run.workspace / "solution.py").write_text(_tiny("hidden(h * 1.0)") + TAMPERING_BODY)
    row = score_run(run)
    assert row.raw is None and "differ from what its recorded operations compute" in row.message, row.message


@pytest.mark.slow
def test_the_solution_process_never_receives_heldout_text(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[dict[str, Any]] = []
    original = SolutionProcess.send
    monkeypatch.setattr(SolutionProcess, "send", lambda self, message: (sent.append(message),
                                                                        original(self, message))[1])
    (run.workspace / "solution.py").write_text(_tiny("F.relu(h)"))
    threads = torch.get_num_threads()
    try:  # the scorer, run here in-process, sets the tier's thread count
        result = get_environment("restricted_mlm").score("mini", run.workspace, run.protected)
    finally:
        torch.set_num_threads(threads)
    assert result.raw is not None, result.message
    heldout = np.fromfile(run.protected / "heldout.bin", dtype=np.uint16)
    windows = {tuple(heldout[i:i + 8]) for i in range(0, len(heldout) - 8)}
    for message in sent:
        for sequence in message.get("inputs", []):
            assert not any(tuple(sequence[i:i + 8]) in windows for i in range(0, len(sequence) - 8, 8))


@pytest.mark.slow
def test_oracle_through_inspect_start_and_reference_are_valid(mlm_home: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Set-up scores the starting solution; the oracle installs the reference (code and weights) through the
    sandbox and scores it until it reaches 0.95 normalised, at most ORACLE_SCORINGS times."""
    from inspect_ai import eval as inspect_eval

    from openrebench.harness import environment_tasks
    from openrebench.harness.agents.oracle import ORACLE_SCORINGS

    monkeypatch.setenv("OPENREBENCH_HOME", str(mlm_home))
    task = environment_tasks()["restricted_mlm"](tier="mini", agent="oracle", runs_dir=str(tmp_path / "runs"))
    (log,) = inspect_eval(task, model="none", log_dir=str(tmp_path / "logs"), display="none")
    assert log.status == "success", log.error
    rows = log.samples[0].scores["rebench_scorer"].metadata["score_log"]
    kinds = [r["kind"] for r in rows]
    assert kinds[0] == "setup" and set(kinds[1:]) == {"score"}, kinds
    assert 1 <= len(kinds) - 1 <= ORACLE_SCORINGS, kinds
    if len(kinds) - 1 < ORACLE_SCORINGS:  # it stopped early only on reaching 0.95
        assert rows[-1]["normalised"] >= 0.95, rows[-1]
    assert all(r["raw"] is not None for r in rows), [r["message"] for r in rows]
    start, *references = rows
    for row in rows:
        assert math.isclose(row["raw"], math.log(row["details"]["loss"] - 1.5))
        assert row["details"]["max_row_difference"] == 0.0 and row["details"]["masked_tokens"] > 5000
    for row in references:
        assert row["raw"] < start["raw"] - 0.3, (start["message"], row["message"])
        assert row["details"]["constants_mb"] > 10  # the reference's bigram tables came with it


@pytest.mark.slow
@pytest.mark.parametrize("failure", ["error", "shape"])
def test_failures_on_heldout_text_give_a_fixed_message(run: Run, monkeypatch: pytest.MonkeyPatch,
                                                       failure: str) -> None:
    """The replay on held-out text raises with a token id in its text, or changes shape: the agent gets a
    fixed description, never the values."""
    from openrebench.environments.restricted_mlm import scorer

    calls = {"n": 0}
    replay = Program.__call__

    def on_heldout(self: Program, x: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        out = replay(self, x)
        if calls["n"] == 1:  # the check against the host's own logits, on the recorded random tokens
            return out
        if failure == "error":
            raise RuleViolation(f"the recorded forward pass cannot be replayed (IndexError: index "
                                f"{int(x[0, 0])} is out of bounds for dimension 0 with size 1)")
        return out[: int(x[0, 0]) % 3 + 1]

    monkeypatch.setattr(Program, "__call__", on_heldout)
    (run.workspace / "solution.py").write_text(_tiny("F.relu(h)"))
    threads = torch.get_num_threads()
    try:
        result = get_environment("restricted_mlm").score("mini", run.workspace, run.protected)
    finally:
        torch.set_num_threads(threads)
    assert result.raw is None and calls["n"] == 2
    expected = scorer.HELDOUT_FAILURE if failure == "error" else "of another shape on held-out text"
    assert expected in result.message and "index" not in result.message
    assert not any(c.isdigit() for c in result.message.replace("(16, 128, 4096)", ""))


@pytest.mark.parametrize("cores", [1, 2, 8])
def test_the_mini_reference_trains_on_two_threads_at_most_and_never_more_than_the_cores(
        cores: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The mini reference model (a minute of training at set-up) splits well over two threads; the
    starting model stays on one; a machine with fewer usable cores trains on what it has."""
    import subprocess

    from openrebench.environments.restricted_mlm import _assets
    from openrebench.lm import AssetError

    commands: list[list[str]] = []

    class Refused(subprocess.Popen):  # type: ignore[type-arg]
        def __init__(self, command: list[str], **kw: Any) -> None:
            commands.append(command)
            raise AssetError("not trained here")

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    monkeypatch.setattr(_assets.subprocess, "Popen", Refused)
    from openrebench.environments.restricted_mlm.env import MINI

    spec = RestrictedMLM.tiers["mini"].model_copy(update={"params": MINI})  # the tier's, not this module's
    (tmp_path / "data").mkdir()
    manifest: Any = type("M", (), {"key": lambda self: {}})()
    for which in ("reference", "starting"):
        with pytest.raises(AssetError):
            _assets._trained(which, spec, tmp_path / "data", manifest, tmp_path)  # type: ignore[arg-type]
    reference, starting = ([a for a in c if a.startswith("--threads=")] for c in commands)
    assert reference == [f"--threads={min(2, cores)}"] and starting == ["--threads=1"]
