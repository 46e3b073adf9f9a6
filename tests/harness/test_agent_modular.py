"""The modular agent: its context trimming on its own, and a scripted attempt (mockllm) end to end through
a real mini environment and its sandbox."""

from __future__ import annotations

from pathlib import Path

import pytest
from inspect_ai import Task
from inspect_ai import eval as inspect_eval
from inspect_ai.dataset import Sample
from inspect_ai.model import (
    ChatMessage,
    ChatMessageAssistant,
    ChatMessageSystem,
    ChatMessageTool,
    ChatMessageUser,
    ModelOutput,
    get_model,
)
from inspect_ai.tool import ToolCall

from kernel_support import write_reference_code
from openrebench.harness import environment_tasks
from openrebench.harness._limits import IDLE_KEY, IDLE_TURNS
from openrebench.harness.agents import get_agent
from openrebench.harness.agents.modular import (
    CHARS_PER_TOKEN,
    TRIM_TARGET,
    clock_note,
    elide,
    estimate_tokens,
    fit_context,
    modular,
)
from openrebench.isolation import bwrap_binary


def _turn(i: int, output: str) -> list[ChatMessage]:
    call = ToolCall(id=f"call-{i}", function="bash", arguments={"command": f"echo step {i}"})
    return [ChatMessageAssistant(content=f"step {i}", tool_calls=[call]),
            ChatMessageTool(content=output, tool_call_id=f"call-{i}", function="bash")]


def _history(turns: int, output_chars: int = 3000) -> list[ChatMessage]:
    messages: list[ChatMessage] = [ChatMessageSystem(content="system prompt"),
                                   ChatMessageUser(content="the task: make it fast")]
    for i in range(turns):
        messages += _turn(i, f"output {i} " + "x" * output_chars)
    return messages


def test_a_long_history_is_trimmed_below_the_window_keeping_the_task_and_the_latest_turn() -> None:
    messages = _history(200)  # ~200k tokens by the estimate
    window = 20_000
    view, cut = fit_context(messages, window)
    assert estimate_tokens(view) <= window * TRIM_TARGET
    assert view[:2] == messages[:2]  # the system prompt and the task
    note = view[2]
    assert isinstance(note, ChatMessageUser)
    assert f"{cut - 2} earlier messages were dropped" in note.text
    assert view[3:] == messages[cut:] and view[-2:] == messages[-2:]  # the latest turn, whole
    assert isinstance(view[3], ChatMessageAssistant)  # never a tool result without its call


def test_the_cut_stays_put_until_the_window_fills_again() -> None:
    """A stable prefix: the provider's prompt cache keeps hitting turn after turn."""
    messages = _history(200)
    _, cut = fit_context(messages, 20_000)
    messages += _turn(200, "short")
    view, again = fit_context(messages, 20_000, cut)
    assert again == cut and view[-2:] == messages[-2:]
    for i in range(201, 260):  # enough turns to overflow again: the cut moves forward
        messages += _turn(i, "y" * 3000)
    view, later = fit_context(messages, 20_000, cut)
    assert later > cut and estimate_tokens(view) <= 20_000


def test_a_short_history_is_sent_whole() -> None:
    messages = _history(3)
    view, cut = fit_context(messages, 20_000)
    assert view == messages and cut == 2


def test_the_latest_turn_is_kept_even_when_it_alone_overflows() -> None:
    messages = _history(5, output_chars=200_000)
    view, cut = fit_context(messages, 1_000)
    assert view[-2:] == messages[-2:] and cut == len(messages) - 2


def test_long_outputs_keep_their_head_and_tail() -> None:
    text = "HEAD" + "m" * 50_000 + "TAIL"
    short = elide(text, 1000)
    assert short.startswith("HEAD") and short.endswith("TAIL") and len(short) < 1100
    assert f"{len(text) - 1000} characters elided" in short
    assert elide("small", 1000) == "small"
    assert len(short) // CHARS_PER_TOKEN < len(text) // CHARS_PER_TOKEN


def test_the_clock_note_says_used_and_left() -> None:
    assert clock_note(90, 1800) == "Working time: 1.5 min used, 28.5 min left of 30 minutes."
    assert "0.0 min left" in clock_note(2000, 1800)


def test_it_is_registered_as_a_model_agent_with_limits_scaled_by_time() -> None:
    spec = get_agent("modular")
    assert spec.needs_model and spec.description
    assert spec.limits(8 * 3600).messages > spec.limits(3600).messages


def test_an_overflow_is_retried_and_a_model_that_only_talks_is_stopped(tmp_path: Path) -> None:
    """No sandbox: the loop alone, on a plain Inspect task."""
    overflow = ModelOutput.from_message(ChatMessageAssistant(content=""), stop_reason="model_length")
    talk = [ModelOutput.from_content("mockllm/model", f"thinking {i}") for i in range(IDLE_TURNS)]
    task = Task(dataset=[Sample(input="the task")], solver=modular("system prompt", 600))
    (log,) = inspect_eval(task, model=get_model("mockllm/model", custom_outputs=[overflow, *talk]),
                          log_dir=str(tmp_path), display="none")
    assert log.status == "success", log.error
    (sample,) = log.samples
    assert sample.store[IDLE_KEY] == IDLE_TURNS
    calls = [e for e in sample.events if e.event == "model"]
    assert len(calls) == 1 + IDLE_TURNS  # the overflow retried, not kept
    said = [m.text for m in sample.messages if isinstance(m, ChatMessageAssistant)]
    assert said == [f"thinking {i}" for i in range(IDLE_TURNS)]
    assert calls[0].input[-1].text == "Working time: 0.0 min used, 10.0 min left of 10 minutes."


@pytest.mark.slow
@pytest.mark.skipif(bwrap_binary() is None, reason="bubblewrap is not available")
def test_scripted_modular_attempt_scores_broken_then_reference_and_submits(tmp_path: Path) -> None:
    write_reference = write_reference_code("example_fit")  # the example plug-in: a scoring in a second
    outputs = [
        ModelOutput.for_tool_call("mockllm/model", "bash",  # a wrong answer: one prediction for 500 xs
                                  {"command": "printf 'def predict(xs):\\n    return [0]\\n' > solution.py"}),
        ModelOutput.for_tool_call("mockllm/model", "score", {}),
        ModelOutput.for_tool_call("mockllm/model", "bash",
                                  {"command": "head -c 60000 /dev/zero | tr '\\0' z"}),  # a long output
        ModelOutput.for_tool_call("mockllm/model", "python", {"code": write_reference}),
        ModelOutput.for_tool_call("mockllm/model", "score", {}),
        ModelOutput.for_tool_call("mockllm/model", "submit", {"answer": "done"}),
    ]
    model = get_model("mockllm/model", custom_outputs=outputs)
    task = environment_tasks()["example_fit"](tier="mini", agent="modular", runs_dir=str(tmp_path / "runs"))
    (log,) = inspect_eval(task, model=model, log_dir=str(tmp_path / "logs"), display="none")
    assert log.status == "success", log.error
    (sample,) = log.samples
    tools = [m for m in sample.messages if isinstance(m, ChatMessageTool)]
    assert [m.function for m in tools] == ["bash", "score", "bash", "python", "score", "submit"]
    assert "Invalid: predict(xs) must return a list of 500 numbers, got 1" in tools[1].text
    assert "characters elided" in tools[2].text and len(tools[2].text) < 13_000
    assert sample.output.completion == "done"
    # The clock was shown before every step, and the system prompt states the working time.
    inputs = [e.input for e in sample.events if e.event == "model"]
    assert len(inputs) == len(outputs)
    assert all(m[-1].text.startswith("Working time:") and "Tokens:" in m[-1].text for m in inputs)
    assert isinstance(sample.messages[0], ChatMessageSystem) and "of working time" in sample.messages[0].text
    score = sample.scores["rebench_scorer"]
    rows = score.metadata["score_log"]
    assert [r["kind"] for r in rows] == ["setup", "score", "score"]
    assert rows[1]["raw"] is None and rows[2]["raw"] is not None
    assert rows[2]["normalised"] == pytest.approx(1.0) and score.value == pytest.approx(1.0)
