"""Progress reports of long work: stages reach the active sink, rich renders them in and out of a
terminal, Inspect's footer gets them on its own thread, and the builders report (cached ones do not)."""

from __future__ import annotations

import asyncio
import io
import logging
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import anyio
import numpy as np
import pytest
from rich.console import Console

from openrebench.api import StageUpdate, _progress, cached_build, reporting, show_progress, stage
from openrebench.api._progress import RichProgress, progress_active
from openrebench.harness import _progress as inspect_progress
from openrebench.harness._progress import CAPTION, InspectProgress
from openrebench.lm import SPLITS, Corpus, GPTConfig, TrainConfig, build_trained_model

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture
def unthrottled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_progress, "THROTTLE_S", 0.0)


def _summary(updates: list[StageUpdate]) -> list[tuple[str, str, bool]]:
    return [(u.label, u.count, u.done) for u in updates]


def test_nested_stages_and_counts_reach_the_sink(unthrottled: None) -> None:
    seen: list[StageUpdate] = []
    with reporting(seen.append):
        assert progress_active()
        with stage("mini corpus"), stage("tokenising", total=3, n=1) as step:
            step.advance()
            step.update(3, what="tokenising (last batch)")
    assert not progress_active()
    assert _summary(seen) == [
        ("mini corpus", "", False),
        ("mini corpus › tokenising", "1/3", False),
        ("mini corpus › tokenising", "2/3", False),
        ("mini corpus › tokenising (last batch)", "3/3", False),
        ("mini corpus › tokenising (last batch)", "3/3", True),
        ("mini corpus", "", True),
    ]
    assert len({u.id for u in seen}) == 2 and seen[-1].elapsed_s >= seen[0].elapsed_s


def test_without_a_sink_stages_report_nothing_and_updates_are_throttled() -> None:
    with stage("alone", total=10) as quiet:
        quiet.advance(10)
    assert quiet.sink is None and quiet.n == 10
    seen: list[StageUpdate] = []
    with reporting(seen.append), stage("training", total=100_000) as steps:
        for i in range(100_000):
            steps.update(i + 1)
    assert seen[0].n == 0 and seen[-1].done and seen[-1].n == 100_000
    assert len(seen) < 20, len(seen)  # a fast loop is not reported step by step


def test_a_label_changed_just_before_an_inner_stage_is_not_shown_late() -> None:
    seen: list[StageUpdate] = []
    with reporting(seen.append), stage("experiments", total=2) as runs:
        for width in (8, 16):
            runs.update(what=f"experiment n_embd={width}")  # within the throttle's interval
            with stage("training"):
                pass
            runs.advance()
    starts = [u.label for u in seen if not u.done]
    assert starts == ["experiments", "experiment n_embd=8", "experiment n_embd=8 › training",
                      "experiment n_embd=16", "experiment n_embd=16 › training"], starts


def test_the_sink_follows_the_work_into_worker_threads(unthrottled: None) -> None:
    seen: list[StageUpdate] = []

    def work() -> None:
        with stage("inner", total=1) as s:
            s.advance()

    async def main() -> None:
        with reporting(seen.append), stage("outer"):
            await asyncio.to_thread(work)

    asyncio.run(main())
    assert [u.label for u in seen if u.done] == ["outer › inner", "outer"]


def test_a_stage_ended_by_an_error_says_so(unthrottled: None) -> None:
    seen: list[StageUpdate] = []
    with pytest.raises(KeyboardInterrupt), reporting(seen.append), stage("outer"):
        with stage("fine"):
            pass
        with stage("interrupted"):
            raise KeyboardInterrupt
    assert [(u.label, u.failed) for u in seen if u.done] == [
        ("outer › fine", False), ("outer › interrupted", True), ("outer", True)]
    out = io.StringIO()
    with pytest.raises(OSError), show_progress(Console(file=out)), stage("disk", total=4) as s:
        s.advance()
        raise OSError("no space left")
    assert re.fullmatch(r"disk…\ndisk: 1/4 stopped after \d+\.\d s\n", out.getvalue()), out.getvalue()


def test_a_failing_sink_does_not_stop_the_work(caplog: pytest.LogCaptureFixture) -> None:
    def broken(u: StageUpdate) -> None:
        raise OSError("terminal gone")

    with caplog.at_level(logging.WARNING), reporting(broken), stage("build", total=2) as s:
        s.advance(2)
    assert s.n == 2 and "progress display failed" in caplog.text


def test_rich_bars_share_a_terminal_with_a_status_spinner(unthrottled: None) -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100, color_system=None)
    with console.status("Setting up…"), show_progress(console):
        with stage("mini corpus"), stage("tokenising", total=3) as s:
            s.advance(3)
            time.sleep(0.3)  # the spinner redraws both, a dozen times a second
        with stage("GPT-2 tokenizer"):
            pass
    text = ANSI.sub("", out.getvalue())
    assert "Setting up…\nmini corpus" in text and "  tokenising" in text and "3/3" in text
    # what stays on screen: the finished outer stages, not their inner steps
    after = text[text.rindex("3/3"):]
    assert "mini corpus" in after and "GPT-2 tokenizer" in after and "tokenising" not in after, after


def test_rich_writes_lines_where_the_console_is_not_a_terminal(unthrottled: None) -> None:
    out = io.StringIO()
    with (show_progress(Console(file=out, width=100)), stage("mini corpus"),
          stage("tokenising", total=2) as s, stage("a step too deep for a log")):
        s.advance(2)
    assert re.sub(r"\d+\.\d s", "T", out.getvalue()).splitlines() == [
        "mini corpus…", "  tokenising…", "  tokenising: 2/2 done in T", "mini corpus: done in T"]


def test_the_default_display_on_a_captured_stderr_does_not_crash(capsys: pytest.CaptureFixture[str]) -> None:
    display = RichProgress()
    assert not display.console.is_terminal
    with reporting(display), stage("quick"):
        pass
    display.close()
    assert "quick: done in" in capsys.readouterr().err


def test_inspect_footer_is_updated_in_a_task_on_the_event_loop_thread(unthrottled: None) -> None:
    calls: list[tuple[str, str, bool]] = []

    def counter(caption: str, value: str) -> None:  # Inspect's display throttles with background tasks
        in_a_task = asyncio.current_task() is not None
        calls.append((caption, value, threading.current_thread() is threading.main_thread() and in_a_task))

    def build() -> None:
        with stage("mini corpus"), stage("tokenising [batch]", total=2) as s:
            s.advance(2)

    async def sample_init() -> None:
        with reporting(InspectProgress(counter)):
            await anyio.to_thread.run_sync(build)
        await asyncio.sleep(0.1)  # let the loop run what the worker handed over

    asyncio.run(sample_init())
    assert all(caption == CAPTION and on_loop for caption, _, on_loop in calls), calls
    values = [value for _, value, _ in calls]
    assert values[:3] == ["mini corpus", "mini corpus › tokenising \\[batch] 0/2",
                          "mini corpus › tokenising \\[batch] 2/2"]  # escaped: the footer is markup
    assert values[-2] == "mini corpus" and re.fullmatch(r"mini corpus ✓ \d+ s", values[-1])


@pytest.mark.parametrize(("display", "shown"), [("full", True), ("rich", True), ("plain", False),
                                                ("log", False), ("none", False)])
def test_inspect_counter_is_used_only_by_displays_that_show_it(monkeypatch: pytest.MonkeyPatch,
                                                                display: str, shown: bool) -> None:
    import inspect_ai.util

    calls: list[tuple[str, str]] = []
    monkeypatch.setattr(inspect_ai.util, "display_type", lambda: display)
    monkeypatch.setattr(inspect_ai.util, "display_counter", lambda c, v: calls.append((c, v)))
    inspect_progress._inspect_counter(CAPTION, "mini corpus 1/2")
    assert calls == ([(CAPTION, "mini corpus 1/2")] if shown else [])


def test_a_cached_build_reports_only_when_it_builds(tmp_path: Path, unthrottled: None) -> None:
    def build(partial: Path, deadline: object) -> tuple[dict, dict]:
        with stage("writing", total=1) as s:
            (partial / "x.txt").write_text("x")
            s.advance()
        return {}, {}

    seen: list[StageUpdate] = []
    with reporting(seen.append):
        for _ in range(2):
            cached_build(tmp_path / "asset", what="test:x", builder_version="1", seed=None, params={},
                         build=build, label="a test asset")
    writing = "a test asset › writing"
    assert _summary(seen) == [("a test asset", "", False), (writing, "0/1", False), (writing, "1/1", False),
                              (writing, "1/1", True), ("a test asset", "", True)]


def _tiny_corpus(folder: Path) -> Corpus:
    """Token files of a repeating pattern in a 97-token vocabulary: a corpus as far as training cares."""
    tokens = np.tile(np.arange(97, dtype=np.uint16), 40)

    def build(partial: Path, deadline: object) -> tuple[dict, dict]:
        for split in SPLITS:
            tokens.tofile(partial / f"{split}.bin")
        return {}, {}

    manifest = cached_build(folder, what="corpus:tiny", builder_version="1", seed=0, params={}, build=build)
    return Corpus(folder, manifest)


def test_training_a_model_asset_reports_its_steps(tmp_path: Path, unthrottled: None) -> None:
    corpus = _tiny_corpus(tmp_path / "corpus")
    model_config = GPTConfig(block_size=16, vocab_size=97, n_layer=1, n_head=2, n_embd=16)
    config = TrainConfig(max_iters=6, batch_size=2, learning_rate=1e-2, warmup_iters=1, eval_batches=2)
    seen: list[StageUpdate] = []
    with reporting(seen.append):
        for _ in range(2):  # the second call reuses the cached model and says nothing
            build_trained_model("tiny", model_config, config, corpus, cache_dir=tmp_path, progress=False,
                                label="the tiny GPT")
    done = [(u.path[0], u.what.split(" (")[0], u.count) for u in seen if u.done]
    assert done == [("the tiny GPT", "training", "6/6"), ("the tiny GPT", "held-out loss", ""),
                    ("the tiny GPT", "the tiny GPT", "")]
    steps = [u.n for u in seen if u.path[-1].startswith("training")]
    assert steps == sorted(steps) and steps[0] == 0 and steps[-1] == 6


def test_restricted_mlm_training_progress_is_read_from_its_log(tmp_path: Path, unthrottled: None) -> None:
    from openrebench.environments.restricted_mlm._assets import _follow

    log = tmp_path / "train.log"
    script = ("import time\nfor i in (0, 100, 199):\n"
              "    print(f'iter {i}: loss 1.0', flush=True)\n    time.sleep(0.6)")
    seen: list[StageUpdate] = []
    with open(log, "w") as out, reporting(seen.append):
        process = subprocess.Popen([sys.executable, "-c", script], stdout=out, stderr=subprocess.STDOUT)
        assert _follow(process, log, 200) == 0
    assert seen[-1].done and (seen[-1].n, seen[-1].total) == (200, 200)
    assert {u.n for u in seen} >= {0, 200} and len({u.n for u in seen}) >= 3  # it moved while it ran
