"""Reading openrebench's Inspect logs: a real log, and malformed or partial ones giving one clear line."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from inspect_ai.log import EvalError, EvalLog, read_eval_log

from analysis_helpers import REAL_LOG, runs_log, write_variant
from openrebench.analysis import RELEASE_ONLY_ENVIRONMENTS, analyze, load_logs, load_paper
from openrebench.analysis._environments import facts_of
from openrebench.api import Direction, OpenRebenchError
from openrebench.harness import load_prices
from openrebench.runs import environment_classes


def test_real_log_gives_one_attempt_with_its_score_log() -> None:
    data = load_logs([REAL_LOG])
    assert len(data.attempts) == 1 and not data.warnings
    a = data.attempts[0]
    assert (a.env_id, a.tier, a.group, a.is_human) == ("optimize_kernel", "mini", "oracle (mini)", False)
    assert a.length_h == 2.0 and a.score == pytest.approx(1.0095, abs=1e-3)
    assert a.trajectory is not None and len(a.trajectory) == 2 and a.trajectory[0] == (0.0, 0.0)
    assert (a.tokens, a.cost_usd, a.gpu_hours) == (0, 0.0, 0.0)
    assert a.hours_used == pytest.approx(22.653 / 3600)


def test_directories_are_searched_and_duplicates_are_reported(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    shutil.copy(REAL_LOG, tmp_path / "sub" / "a.eval")
    shutil.copy(REAL_LOG, tmp_path / "b.eval")  # the same eval under another name
    data = load_logs([tmp_path, tmp_path / "b.eval"])
    assert len(data.attempts) == 1
    assert len(data.sources) == 2
    assert any("the same sample was given twice; counted once" in w for w in data.warnings)


def test_tokens_cost_and_gpu_hours(tmp_path: Path) -> None:
    log = runs_log(tmp_path / "r.eval", agent="react", model="openai/gpt-4o", hours=0.5, gpus=2,
                   runs=[[(0.1, 0.2), (0.4, 0.5)], [(0.2, 0.3)]], tokens=1000, cost=0.25)
    data = load_logs([log])
    assert [a.score for a in data.attempts] == [0.5, 0.3]
    a = data.attempts[0]
    assert a.group == "react · openai/gpt-4o (mini)" and a.tokens == 1000 and a.cost_usd == 0.25
    assert a.gpu_hours == pytest.approx(2 * 0.45)


def test_prices_fill_in_a_missing_cost(tmp_path: Path) -> None:
    log = runs_log(tmp_path / "r.eval", agent="react", model="openai/my-model", hours=0.5,
                   runs=[[(0.1, 0.2)]], tokens=2_000_000, cost=None)
    assert load_logs([log]).attempts[0].cost_usd is None  # in no price table
    prices = tmp_path / "prices.json"
    prices.write_text('{"openai/my-model": {"input": 2.5, "output": 10}}')
    assert load_logs([log], prices=load_prices(prices)).attempts[0].cost_usd == pytest.approx(12.5)
    prices.write_text('{"openai/gpt-4o": 3}')
    with pytest.raises(OpenRebenchError, match="expected"):
        load_prices(prices)


def test_a_log_from_before_the_scorer_was_renamed_loads(tmp_path: Path) -> None:
    assert "run_score" in read_eval_log(str(REAL_LOG)).samples[0].scores  # type: ignore[index,operator]
    (old,) = load_logs([REAL_LOG]).attempts
    (new,) = load_logs([write_variant(tmp_path / "new.eval", lambda log: None)]).attempts
    assert old.score == new.score and old.raw == new.raw and old.env_id == new.env_id == "optimize_kernel"


def _drop_scores(log: EvalLog) -> None:
    log.samples[0].scores = {}  # type: ignore[index]


def _failed_sample(log: EvalLog) -> None:
    log.samples[0].scores = None  # type: ignore[index]
    log.samples[0].error = EvalError(message="RuntimeError: sandbox died\nTraceback...", traceback="",  # type: ignore[index]
                                     traceback_ansi="")


def _no_samples(log: EvalLog) -> None:
    log.samples = []
    log.status = "error"
    log.error = EvalError(message="the harness crashed", traceback="", traceback_ansi="")


def _meta(key: str, value: object):  # type: ignore[no-untyped-def]
    def edit(log: EvalLog) -> None:
        meta = log.samples[0].scores["rebench_scorer"].metadata  # type: ignore[index,union-attr]
        if value is None:
            del meta[key]
        else:
            meta[key] = value

    return edit


def _value(value: object):  # type: ignore[no-untyped-def]
    def edit(log: EvalLog) -> None:
        log.samples[0].scores["rebench_scorer"].value = value  # type: ignore[index]

    return edit


def _not_ours(log: EvalLog) -> None:
    log.eval.metadata = {}


def _no_limit(log: EvalLog) -> None:
    log.eval.config.working_limit = None
    log.eval.task_args = {}


MALFORMED = [
    (_drop_scores, "no 'rebench_scorer' score; pass --skip-incomplete"),
    (_failed_sample, "the sample failed (RuntimeError: sandbox died); pass --skip-incomplete"),
    (_no_samples, "the log has no samples (status error: the harness crashed); pass --skip-incomplete"),
    (_meta("fingerprint", None), "score metadata lacks 'fingerprint'"),
    (_meta("score_log", None), "score metadata lacks 'score_log'"),
    (_meta("score_log", "rows"), "'score_log' is not a list of rows"),
    (_meta("score_log", [{"index": 0, "elapsed_s": "soon"}]), "score_log row 0 is malformed"),
    (_meta("fingerprint", {"env_id": "optimize_kernel"}), "'fingerprint' has no hardware record"),
    (_meta("fingerprint", {"env_id": "optimize_kernel", "hardware": {"gpu_count": "x"}}),
     "the fingerprint's gpu_count 'x' is not a count"),
    (_value("high"), "score value 'high' is not a number"),
    (_value(float("nan")), "is not finite"),
    (_not_ours, "not an openrebench log"),
    (_no_limit, "records no working time limit"),
]


@pytest.mark.parametrize(("edit", "message"), MALFORMED)
def test_malformed_logs_give_one_clear_error(tmp_path: Path, edit, message: str) -> None:  # type: ignore[no-untyped-def]
    path = write_variant(tmp_path / "bad.eval", edit)
    with pytest.raises(OpenRebenchError) as info:
        load_logs([path])
    text = str(info.value)
    assert message in text, text
    assert "\n" not in text and "bad.eval" in text


def _limit(working: object = None, task_arg: object = None):  # type: ignore[no-untyped-def]
    def edit(log: EvalLog) -> None:
        log.eval.config.working_limit = working  # type: ignore[assignment]
        log.eval.task_args = {"time_limit": task_arg}

    return edit


def _cancelled(log: EvalLog) -> None:
    log.samples = []
    log.status = "cancelled"


RANGE = "is outside 1 minute to 7 days (60 to 604800 seconds)"
ODD_LIMITS = [
    (_limit(0), f"its working time limit (0 s) {RANGE}"),  # what `--time-limit 0.001s` used to write
    (_limit(1), f"its working time limit (1 s) {RANGE}"),
    (_limit(-300), f"its working time limit (-300 s) {RANGE}"),
    (_limit(3_600_000_000_000), f"its working time limit (3.6e+12 s) {RANGE}"),
    (_limit(task_arg=float("nan")), f"its working time limit (nan s) {RANGE}"),
    (_limit(task_arg=float("inf")), f"its working time limit (inf s) {RANGE}"),
    (_limit(task_arg="30m"), "its working time limit '30m' is not a number of seconds"),
    (_no_limit, "records no working time limit"),
    (_cancelled, "no samples (status cancelled)"),
]


@pytest.mark.parametrize(("edit", "message"), ODD_LIMITS)
def test_odd_time_limits_stop_in_one_line_or_are_left_out_with_a_warning(tmp_path: Path, edit,  # type: ignore[no-untyped-def]
                                                                         message: str) -> None:
    path = write_variant(tmp_path / "odd.eval", edit)
    with pytest.raises(OpenRebenchError) as info:
        load_logs([path])
    assert message in str(info.value) and "pass --skip-incomplete" in str(info.value)
    assert "\n" not in str(info.value)
    data = load_logs([path, REAL_LOG], skip_incomplete=True)
    assert len(data.attempts) == 1
    assert any(w.startswith("odd.eval: left out") and message in w for w in data.warnings), data.warnings


@pytest.mark.parametrize(("edit", "hours"), [(_limit(60), 1 / 60), (_limit(7 * 24 * 3600), 168.0),
                                             (_limit(task_arg="1800"), 0.5)])
def test_time_limits_at_the_range_ends_are_used(tmp_path: Path, edit, hours: float) -> None:  # type: ignore[no-untyped-def]
    (attempt,) = load_logs([write_variant(tmp_path / "ok.eval", edit)]).attempts
    assert attempt.length_h == pytest.approx(hours)


def test_a_log_without_a_model_is_labelled_by_its_agent(tmp_path: Path) -> None:
    def no_model(log: EvalLog) -> None:
        log.eval.model = "none/none"

    (attempt,) = load_logs([write_variant(tmp_path / "none.eval", no_model)]).attempts
    assert attempt.group == "oracle (mini)"


@pytest.mark.parametrize(("edit", "left_out"), [(_drop_scores, "left out: no 'rebench_scorer' score"),
                                                (_no_samples, "left out, no samples")])
def test_skip_incomplete_lists_what_it_leaves_out(tmp_path: Path, edit, left_out: str) -> None:  # type: ignore[no-untyped-def]
    bad = write_variant(tmp_path / "bad.eval", edit)
    data = load_logs([bad, REAL_LOG], skip_incomplete=True)
    assert len(data.attempts) == 1
    assert any(left_out in w for w in data.warnings), data.warnings


def test_score_log_warnings_are_carried(tmp_path: Path) -> None:
    torn = ["score_log.jsonl:3: unreadable row skipped"]
    path = write_variant(tmp_path / "w.eval", _meta("log_warnings", torn))
    assert any("unreadable row skipped" in w for w in load_logs([path]).warnings)


@pytest.mark.parametrize(("name", "content", "message"), [
    ("missing.eval", None, "does not exist"),
    ("notes.txt", b"hello", "is not an Inspect log (expected a .eval or .json file)"),
    ("garbage.eval", b"\x00\x01 not a zip", "not a readable Inspect log"),
    ("garbage.json", b"{\"version\": ", "not a readable Inspect log"),
    ("empty", "dir", "no Inspect logs (.eval or .json) in this directory"),
])
def test_unreadable_inputs(tmp_path: Path, name: str, content: bytes | str | None, message: str) -> None:
    path = tmp_path / name
    if content == "dir":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    with pytest.raises(OpenRebenchError, match=re.escape(message)):
        load_logs([path])


def test_paper_data_rows_as_documented() -> None:
    data = load_paper(human_hours=None, hacks="keep")  # every real attempt, every score as released
    humans = [a for a in data.attempts if a.is_human]
    agents = [a for a in data.attempts if not a.is_human]
    assert len(humans) == 86 and len(agents) == 1719
    assert {a.env_id for a in data.attempts} == {
        "optimize_kernel", "optimize_finetune", "fix_embedding", "chat_rl", "scaling_law", "restricted_mlm",
        "rust_codecontests"}
    assert sum(a.score for a in humans) / len(humans) == pytest.approx(0.63, abs=0.005)
    assert any("1 readme_only, 7 suspected_placeholder" in n for n in data.notes)
    assert any("4 agent runs have no normalised score" in n for n in data.notes)
    assert not any(a.altered for a in agents) and not data.paper.altered  # type: ignore[union-attr]


def test_paper_environments_come_from_the_registry_and_the_release() -> None:
    facts = load_paper().env_facts
    for env_id, cls in environment_classes().items():
        if env_id in facts:  # a built-in RE-Bench environment: its own class says
            assert facts[env_id] == facts_of(cls)
    assert {f.env_id for f in RELEASE_ONLY_ENVIRONMENTS} == {"chat_rl", "rust_codecontests"}
    # Both are built in now: the registry's facts win, the release's are a fallback for installs without.
    assert facts["chat_rl"].source == facts["rust_codecontests"].source == "registered environment"
    assert [e for e, f in facts.items() if not f.score_visible] == ["scaling_law"]


def _gone(logged: dict[str, object]) -> Callable[[EvalLog], None]:
    """The real log as if written for `gone_env`, a plug-in since uninstalled, recording `logged`."""

    def edit(log: EvalLog) -> None:
        log.eval.metadata = {**(log.eval.metadata or {}), "env_id": "gone_env", **logged}
        for sample in log.samples or []:
            sample.metadata = {**(sample.metadata or {}), "env_id": "gone_env"}
            score = sample.scores["rebench_scorer"]  # type: ignore[index]
            score.metadata["fingerprint"] = {**score.metadata["fingerprint"], "env_id": "gone_env"}  # type: ignore[index]

    return edit


def test_a_log_of_an_environment_no_longer_installed_loads_with_a_note(tmp_path: Path) -> None:
    data = load_logs([write_variant(tmp_path / "a.eval", _gone({}))])
    assert [a.env_id for a in data.attempts] == ["gone_env"] and not data.warnings
    assert data.env_facts["gone_env"].score_visible and data.env_facts["gone_env"].direction is None
    assert any(n.startswith("gone_env is not a registered environment") and "taken as visible" in n
               for n in data.notes)
    assert analyze(data, boots=10, sims=10).settings.hidden_score == []


def test_what_a_log_records_of_its_environment_is_used_when_it_is_not_installed(tmp_path: Path) -> None:
    logged = {"score_visible": False, "direction": "last", "rebench_id": None}
    data = load_logs([write_variant(tmp_path / "a.eval", _gone(logged))])
    facts = data.env_facts["gone_env"]
    assert (facts.score_visible, facts.direction, facts.source) == (False, Direction.LAST, "its log (a.eval)")
    assert any("read as its log (a.eval) says (score hidden, direction last)" in n for n in data.notes)
    assert analyze(data, boots=10, sims=10).settings.hidden_score == ["gone_env"]
    # A registered environment's own attributes win over what its log says.
    data = load_logs([write_variant(tmp_path / "b.eval", lambda log: log.eval.metadata.update(logged))])  # type: ignore[union-attr]
    assert data.env_facts["optimize_kernel"].score_visible and not data.notes
