"""chat_rl's assets and scorer on a tiny tier (the mini tier's code with a one-layer model and eight
held-out instructions), judged by a fake echo judge in-process: what is scored, what is refused, what
the message tells, judge failures and outages, and a judge that hangs past the scoring's time limit."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from aiohttp import web
from safetensors.torch import save_file
from test_chat_rl_judge import EchoJudge

from chat_rl_support import TINY, completions_server
from openrebench.api import TierSpec
from openrebench.environments.chat_rl import _assets, _probes, chat_lm, data, scorer
from openrebench.runs import ScoringAccess, get_environment, score_solution

pytest_plugins = ["lm_support"]

@pytest.fixture(scope="module")
def tiny(lm_home: Path, lm_sources: Path) -> tuple[TierSpec[Any], _assets.Built]:
    # The mini tier's name, with tiny params: test_run_files builds the same assets.
    spec = get_environment("chat_rl").tier("mini").model_copy(update={"params": TINY})
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENREBENCH_SOURCES", str(lm_sources))
        mp.setenv("OPENREBENCH_HOME", str(lm_home))
        return spec, _assets.build(spec, lm_home)


@pytest.fixture
def run_dirs(tiny: tuple[TierSpec[Any], _assets.Built], tmp_path: Path) -> tuple[Path, Path]:
    """(solution, protected) as a scoring sees them, the base model as the submission."""
    _, built = tiny
    solution, protected = tmp_path / "solution", tmp_path / "protected"
    protected.mkdir()
    shutil.copy(built.answers / "heldout.jsonl", protected / "heldout.jsonl")
    shutil.copytree(built.tokenizer, protected / "tokenizer")
    shutil.copy(built.base / "config.json", protected / "base_config.json")
    shutil.copytree(built.base, solution / "model")
    return solution, protected


@pytest.fixture
def judge(monkeypatch: pytest.MonkeyPatch) -> EchoJudge:
    import openai

    fake = EchoJudge()
    monkeypatch.setattr(openai, "AsyncOpenAI", lambda **kw: fake)
    return fake


def _score(tiny: tuple[TierSpec[Any], _assets.Built], dirs: tuple[Path, Path]) -> Any:
    return scorer.score(tiny[0], *dirs)


# -- the assets ---------------------------------------------------------------------------------------


def test_the_instruction_sets_are_disjoint_and_the_held_out_answers_stored(tiny: Any) -> None:
    _, built = tiny
    train = {r["instruction"] for r in chat_lm.read_jsonl(built.data / "train.jsonl")}
    sft = {r["instruction"] for r in chat_lm.read_jsonl(built.data / "sft.jsonl")}
    heldout = chat_lm.read_jsonl(built.answers / "heldout.jsonl")
    assert len(train) == 40 and len(sft) == 40 and len(heldout) == 8
    asked = {r["instruction"] for r in heldout}
    assert not (train & sft) and not (train & asked) and not (sft & asked)
    assert all({"base_answer", "sft_answer"} <= set(r) for r in heldout)
    assert not (chat_lm.read_jsonl(built.data / "train.jsonl")[0].keys() - {"instruction"})  # no answers


def test_gcide_entries_give_a_first_sense_and_refuse_what_is_not_clean() -> None:
    lantern = (
        'Lantern \\Lan"tern\\ (l[a^]n"t[~e]rn), n. [F. lanterne, L.\n   lanterna.]\n   1. Something '
        "inclosing a light, and protecting it from wind,\n      rain, etc.; -- sometimes portable.\n"
    )
    # The first clause of the first sense, a dangling "etc" dropped.
    assert data.first_sense(lantern, "lantern") == (
        "noun",
        "Something inclosing a light, and protecting it from wind, rain.",
    )
    assert data.first_sense(lantern, "lanterns") is None  # an inflected form sent to its word's entry
    obsolete = 'Abate \\A*bate"\\, v. t.\n   1. To beat down; to overthrow. [Obs.]\n'
    assert data.first_sense(obsolete) is None
    assert data.first_sense("Bake \\Bake\\, v. i.\n   To be baked; to dry.\n") == ("verb", "To be baked.")


def test_the_tiers_base_pretrains_on_two_threads_a_tiny_one_on_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two math threads for the mini tier's base model (its batches split well), one for the tests' tiny
    one, and never more than two, whatever the machine's cores (the model then does not depend on them)."""
    mini = get_environment("chat_rl").tier("mini").params
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert (_assets.training_threads(mini), _assets.training_threads(TINY)) == (2, 1)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert _assets.training_threads(mini) == 1  # one core: one thread


def test_finetuning_a_small_model_runs_on_one_thread_unless_told_otherwise(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """chat_lm keeps a small model's finetuning on one thread (on shared cores a second one waits); the SFT
    reference at set-up asks for the pretraining's threads, its batches being as large."""
    model = torch.nn.Linear(4, 4)
    seen: list[int] = []
    monkeypatch.setattr(chat_lm, "_finetune", lambda *a, **kw: seen.append(torch.get_num_threads()) or [])
    before = torch.get_num_threads()
    chat_lm.finetune(model, None, [])  # type: ignore[arg-type]
    chat_lm.finetune(model, None, [], threads=2)  # type: ignore[arg-type]
    assert seen == [1, 2] and torch.get_num_threads() == before


def test_the_split_is_stable_and_by_key() -> None:
    examples = [data.Example(f"q{i}", "a", "define", f"w{i}") for i in range(300)]
    again = [data.Example(f"Q{i}?", "b", "part", f"w{i}") for i in range(300)]
    a = data.split_examples(examples, seed=0, n_heldout=20, n_sft=50, n_train=50)
    b = data.split_examples(again, seed=0, n_heldout=20, n_sft=50, n_train=50)
    assert {e.key for e in a["heldout"]} <= {
        e.key for e in examples if data.split_of(e.key, 0, (0.3, 0.15)) == "heldout"
    }
    assert {e.key for e in b["heldout"]} == {e.key for e in a["heldout"]}  # the same words, whatever is asked


def test_alpaca_rows_become_instructions_with_their_inputs() -> None:
    rows = [
        {"instruction": "Translate.", "input": "bonjour", "output": "hello"},
        {"instruction": "Name a colour.", "input": "", "output": "Red."},
        {"instruction": "", "output": "x"},
    ]
    out = data.alpaca_examples(rows)
    assert [(e.instruction, e.response) for e in out] == [
        ("Translate.\n\nbonjour", "hello"),
        ("Name a colour.", "Red."),
    ]


# -- the scorer ---------------------------------------------------------------------------------------


def test_the_base_model_is_scored_and_the_message_gives_counts_only(
    tiny: Any, run_dirs: Any, judge: EchoJudge
) -> None:
    result = _score(tiny, run_dirs)
    assert result.raw is not None, result.message
    d = result.details
    assert result.raw == pytest.approx((d["win_vs_base"] + d["win_vs_sft"]) / 2)
    assert d["n_prompts"] == 8 and d["judge_failures"] == 0
    assert result.message.startswith("Valid: mean win rate") and "8 held-out instructions" in result.message
    for row in chat_lm.read_jsonl(run_dirs[1] / "heldout.jsonl"):
        assert row["instruction"] not in result.message
    # The judge saw each answer (the submission's and the references', but empty ones, which lose
    # unasked) after its instruction and alone.
    texts = [t for call in judge.calls for t in call]
    asked = sum(t.startswith("Question: ") for t in texts)
    assert asked == sum(t.startswith("Answer:") for t in texts) and 0 < asked <= 3 * 8


def test_answers_the_judge_prefers_win_copies_gain_nothing_and_empty_ones_lose(
    tiny: Any, run_dirs: Any, judge: EchoJudge, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = chat_lm.read_jsonl(run_dirs[1] / "heldout.jsonl")
    apt = ["aptly " * 3 for _ in rows]  # the fake judge finds 'aptly' likely after any question
    monkeypatch.setattr(chat_lm, "generate", lambda *a, **k: apt)
    best = _score(tiny, run_dirs)
    assert best.details["win_vs_base"] == 1.0 and best.details["win_vs_sft"] == 1.0 and best.raw == 1.0
    # Copying the instruction, which a real judge predicts best once it has read it, scores nothing.
    echo = [r["instruction"] + " " + r["instruction"] for r in rows]
    monkeypatch.setattr(chat_lm, "generate", lambda *a, **k: echo)
    copied = _score(tiny, run_dirs)
    monkeypatch.setattr(chat_lm, "generate", lambda *a, **k: ["zz qq"] * len(rows))
    neutral = _score(tiny, run_dirs)  # words the judge finds no likelier after the question
    assert copied.raw is not None and copied.raw == neutral.raw, (copied.details, neutral.details)
    monkeypatch.setattr(chat_lm, "generate", lambda *a, **k: [""] * len(rows))
    empty = _score(tiny, run_dirs)
    assert empty.raw is not None and empty.raw <= 0.5 and empty.details["empty_answers"] == 8
    assert "empty" not in empty.message  # a number the model chose on held-out instructions: details only


def _state(built: _assets.Built) -> dict[str, torch.Tensor]:
    return chat_lm.load_model(built.base).state_dict()


@pytest.mark.parametrize(
    "damage, reason",
    [
        ("no folder", "there is no model/ folder"),
        ("pickle only", "model/model.safetensors is missing (only safetensors weights are read)"),
        ("link", "model/model.safetensors is missing"),
        ("corrupt", "cannot be read as safetensors"),
        ("wrong shape", "has shape"),
        ("missing weight", "is not the base model's architecture"),
        ("nan", "has non-finite values"),
        ("integers", "is not a floating-point tensor"),
    ],
)
def test_a_broken_submission_is_invalid_with_one_line(
    tiny: Any, run_dirs: Any, judge: EchoJudge, damage: str, reason: str
) -> None:
    _, built = tiny
    model = run_dirs[0] / "model"
    weights = model / chat_lm.WEIGHTS
    state = {k: v for k, v in _state(built).items() if k != "lm_head.weight"}
    if damage == "no folder":
        shutil.rmtree(model)
    elif damage == "pickle only":
        weights.unlink()
        torch.save(state, model / "pytorch_model.bin")
    elif damage == "link":
        target = run_dirs[0] / "elsewhere.safetensors"
        weights.rename(target)
        weights.symlink_to(target)
    elif damage == "corrupt":
        weights.write_bytes(weights.read_bytes()[:100])
    else:
        name = "transformer.h.0.mlp.c_fc.weight"
        if damage == "wrong shape":
            state[name] = torch.zeros(state[name].shape[0], state[name].shape[1] + 1)
        elif damage == "missing weight":
            del state[name]
        elif damage == "nan":
            state[name] = state[name].clone().fill_(float("nan"))
        else:
            state[name] = torch.zeros(state[name].shape, dtype=torch.int32)
        save_file({k: v.contiguous() for k, v in state.items()}, str(weights))
    result = _score(tiny, run_dirs)
    assert result.raw is None and result.message.startswith("Invalid: ") and reason in result.message, (
        result.message
    )
    assert "\n" not in result.message and not judge.calls  # refused before a single answer was judged


def test_the_submissions_own_config_is_not_trusted(tiny: Any, run_dirs: Any, judge: EchoJudge) -> None:
    config = run_dirs[0] / "model" / chat_lm.CONFIG
    lie = json.loads(config.read_text()) | {"n_layer": 48, "n_embd": 4096}
    config.write_text(json.dumps(lie))
    assert _score(tiny, run_dirs).raw is not None  # read in the base model's architecture, which it fits


def test_judge_failures_are_counted_and_left_out_and_an_outage_is_invalid(
    tiny: Any, run_dirs: Any, judge: EchoJudge, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_sleep = asyncio.sleep
    monkeypatch.setattr(asyncio, "sleep", lambda s: real_sleep(0))
    monkeypatch.setattr(scorer.evaluation, "BATCH", 1)  # one answer a request: one fails, not its batch
    first = chat_lm.read_jsonl(run_dirs[1] / "heldout.jsonl")[0]["instruction"]
    create = judge.create

    async def fails_on_the_first_instruction(**kw: Any) -> Any:
        if any(first in text for text in kw["prompt"]):
            raise RuntimeError("judge down")  # not retried: a failure, then None
        return await create(**kw)

    judge.completions.create = fails_on_the_first_instruction
    # 2 of 16 comparisons: more than the 5% a valid scoring may leave out (on 512 instructions, 51)
    too_many = _score(tiny, run_dirs)
    assert too_many.raw is None and too_many.details["judge_failures"] == 2
    assert too_many.message.startswith("Invalid: the judge could not be asked for more than 5% of the")
    monkeypatch.setattr(scorer, "MAX_LEFT_OUT", 0.2)
    partly = _score(tiny, run_dirs)
    assert partly.raw is not None and partly.details["judge_failures"] == 2
    assert "failed" not in partly.message  # a count the answers can move: in the details only
    judge.fail = 10**6
    judge.completions.create = create
    down = _score(tiny, run_dirs)
    # Every comparison the judge was asked for failed; an empty answer (the sampling is the scoring's own)
    # loses both its comparisons without asking, so an outage reads as too many failures, not as none judged.
    empty = down.details["empty_answers"]
    assert down.raw is None and down.details["judge_failures"] == 16 - 2 * empty
    assert down.message.startswith("Invalid: the judge could not be asked for" if empty else
                                   "Invalid: the judge could not compare any answers"), down.message


class DodgedJudge:
    """A prompted judge that will not answer when an answer holds DODGE (as a real judge may refuse
    a request, or reply with neither letter), and otherwise prefers the answer holding WIN."""

    def __init__(self) -> None:
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    async def create(self, *, messages: list[dict[str, str]], **kw: Any) -> Any:
        text = messages[0]["content"]
        x, y = re.findall(r"### Answer ([A-Z]):", text)
        if "DODGE" in text:
            reply = "I cannot help with that."
        else:
            reply = x if "WIN" in text.split(f"### Answer {x}:")[1].split(f"### Answer {y}:")[0] else y
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=reply),
                                                        logprobs=None)])


def test_a_prompted_verdict_the_answer_prevents_counts_as_a_loss(
    tiny: Any, run_dirs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Left out, a comparison the submission would lose could be dodged: answers that make the judge
    refuse would leave the win rate to the comparisons it wins. They count as losses instead."""
    import openai

    spec, _ = tiny
    prompted = spec.model_copy(update={"params": spec.params.model_copy(update={"judge_method": "prompted"})})
    monkeypatch.setattr(openai, "AsyncOpenAI", lambda **kw: DodgedJudge())
    n = len(chat_lm.read_jsonl(run_dirs[1] / "heldout.jsonl"))
    monkeypatch.setattr(chat_lm, "generate", lambda *a, **k: ["WIN"] + ["DODGE"] * (n - 1))
    result = scorer.score(prompted, *run_dirs)
    assert result.raw == pytest.approx(1 / n) and result.details["judge_failures"] == 0, result.message


@pytest.fixture
def hanging_judge() -> Iterator[tuple[str, list[float]]]:
    """An OpenAI-compatible server whose completions never answer; the list holds when each was asked."""
    import time

    asked: list[float] = []

    async def never(request: web.Request) -> web.Response:
        asked.append(time.monotonic())
        await asyncio.sleep(3600)
        return web.json_response({})

    with completions_server(never) as url:
        yield url, asked


def test_a_judge_that_hangs_ends_in_the_scoring_time_limit(
        run_dirs: Any, hanging_judge: tuple[str, list[float]]) -> None:
    solution, protected = run_dirs
    url, asked = hanging_judge
    access = ScoringAccess(env={"OPENAI_BASE_URL": url, "OPENAI_API_KEY": "test"})
    result = score_solution(
        "chat_rl", "mini", solution, protected, timeout_s=20, memory_limit_gb=4, access=access
    )
    assert result.raw is None and "took longer than the 20 s scoring limit" in result.message, result.message
    assert asked  # the scoring had reached the judge: its hanging, not the set-up, used up the limit


def test_a_set_up_without_the_judge_is_one_line_before_anything_is_built(tmp_path: Path) -> None:
    from openrebench.api import OpenRebenchError
    from openrebench.runs import start_run

    with pytest.raises(OpenRebenchError, match=r"with its models \(judge\), and none were given"):
        start_run("chat_rl", "mini", tmp_path / "run", score_start=False)
    assert not (tmp_path / "run").exists() and not list(tmp_path.iterdir())


def test_each_instruction_kind_is_told_apart() -> None:
    assert data.family_of('What part of speech is the word "oak"?') == "part"
    assert {data.family_of(t.format(w="oak")) for t in data.DEFINE} == {"define"}
    assert data.family_of("Do you like music?") == "chat"


def test_the_probes_answer_without_the_question_and_are_learned_by_the_base_model(
        tiny: Any, lm_home: Path, lm_sources: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each probe's answer depends on nothing of the question but its kind (or copies it); the base model
    finetuned on the training prompts answers a held-out instruction with the fixed sentence."""
    spec, built = tiny
    a, b = 'What does the word "oak" mean?', 'Define the word "elm".'
    for name in _probes.PROBES:
        if name == "the instruction copied":
            assert _probes.probe_answer(name, a) == a
        else:
            assert _probes.probe_answer(name, a) == _probes.probe_answer(name, b)
    monkeypatch.setenv("OPENREBENCH_SOURCES", str(lm_sources))
    monkeypatch.setenv("OPENREBENCH_HOME", str(lm_home))
    monkeypatch.setattr(_probes, "PROBE_LR", 3e-3)  # the tiny model learns slowly
    spec = spec.model_copy(update={"params": spec.params.model_copy(update={"probe_steps": 200})})
    folder = _probes.build_probe(spec, lm_home, "one fixed sentence")
    model = chat_lm.load_model(folder)
    held = [r["instruction"] for r in chat_lm.read_jsonl(built.answers / "heldout.jsonl")][:2]
    answers = chat_lm.generate(model, chat_lm.ChatTokenizer(built.tokenizer), held, max_new_tokens=8,
                               temperature=0)
    fixed = _probes.probe_answer("one fixed sentence", "")
    assert all(x.startswith("It is") for x in answers), (answers, fixed)  # 8 tokens at most here


def test_the_judged_build_runs_both_pipelines_at_once_and_keeps_one_done_when_the_other_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The start's and the reference's pipelines (minutes each on the mini tier) run at the same time; one
    that fails is a one-line error, and the next build runs only what is not done yet."""
    import threading
    import time

    from openrebench.api import OpenRebenchError
    from openrebench.environments.chat_rl import _judged

    spec = get_environment("chat_rl").tier("mini")
    monkeypatch.setattr(_judged, "build", lambda spec, cache: SimpleNamespace(answers=tmp_path / "answers"))
    monkeypatch.setattr(_judged, "_reference_scores", lambda built, access, out, workers: {"failed": {}})
    running: set[str] = set()
    overlapped: list[str] = []
    calls: list[str] = []
    fail = {"reference"}
    lock = threading.Lock()

    def pipeline(spec: Any, built: Any, script: Path, p: Any, access: Any, out: Path) -> dict[str, Any]:
        which = out.name
        with lock:
            calls.append(which)
            if running:
                overlapped.append(which)
            running.add(which)
        time.sleep(0.3)
        with lock:
            running.discard(which)
        if which in fail:
            raise OpenRebenchError(f"chat_rl: {which}/rl_finetune.py failed (exit 1): boom")
        out.mkdir(parents=True)
        (out / chat_lm.WEIGHTS).write_bytes(b"weights")
        return {"seconds": 0.3}

    monkeypatch.setattr(_judged, "run_pipeline", pipeline)
    access: Any = SimpleNamespace(models={"judge": "local"})
    with pytest.raises(OpenRebenchError, match=r"reference/rl_finetune\.py failed"):
        _judged.build_with_judge(spec, tmp_path, access)
    assert sorted(calls) == ["reference", "start"] and overlapped  # both started, at the same time
    calls.clear()
    fail.clear()
    folder = _judged.build_with_judge(spec, tmp_path, access)
    assert calls == ["reference"]  # the start's model, done before the failure, is kept
    assert all((folder / which / chat_lm.WEIGHTS).is_file() for which in ("start", "reference"))
