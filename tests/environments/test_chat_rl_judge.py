"""chat_rl's judge client (evaluation.py) against fake OpenAI clients: the likelihood judge's scores from
echo log-probabilities, the prompted judge's constrained verdict in both orders (its defences against
verdicts written into answers: tests/redteam/test_judge_attacks.py), retries, failures left as
None, empty answers, one score per answer however many pairs it is in."""

from __future__ import annotations

import asyncio
import math
from types import SimpleNamespace
from typing import Any

import httpx
import openai
import pytest

from chat_rl_support import ChatJudge, echo_logprobs, first_token_logprobs, labels_of, shown_answers
from openrebench.environments.chat_rl import evaluation


def _status_error(
    cls: type[openai.APIStatusError], status: int, body: dict[str, Any] | None = None
) -> Exception:
    request = httpx.Request("POST", "http://judge/v1/completions")
    return cls("judge down", response=httpx.Response(status, request=request), body=body)


class EchoJudge:
    """Echo log-probabilities of a toy judge (`chat_rl_support.echo_logprobs`: an answer scores 2 per word
    associated with the question's). `fail`: how many calls raise first (a status error, or a given
    exception)."""

    def __init__(self, fail: int = 0, error: Exception | None = None) -> None:
        self.calls: list[list[str]] = []
        self.fail, self.error = fail, error
        self.completions = SimpleNamespace(create=self.create)

    async def create(
        self, *, model: str, prompt: list[str], echo: bool, max_tokens: int, logprobs: int
    ) -> Any:
        assert model == "judge" and echo and max_tokens == 0 and logprobs == 0
        self.calls.append(list(prompt))
        if self.fail:
            self.fail -= 1
            raise self.error or _status_error(openai.InternalServerError, 503)
        choices = []
        for i, text in enumerate(prompt):
            out = echo_logprobs(text)
            choices.append(SimpleNamespace(index=i, logprobs=SimpleNamespace(
                text_offset=out["text_offset"], token_logprobs=out["token_logprobs"])))
        return SimpleNamespace(choices=choices)


def test_the_likelihood_judge_prefers_the_answer_the_question_explains() -> None:
    judge = EchoJudge()
    prompts = ["What does the word lantern mean?", "Define the word river.", "Define the word river."]
    pairs = [("a lantern holds a light", "one cat sat"), ("a dog", "a river is a stream"),
             ("stream", "river river river")]
    prefs = asyncio.run(evaluation.evaluate(prompts, pairs, client=judge, method="likelihood"))
    # the third: copying the instruction's word scores nothing (a real model predicts a copy best)
    assert prefs == [1.0, 0.0, 1.0]
    # 6 answers, 2 texts each (with the question, and without), in one request.
    assert len(judge.calls) == 1 and len(judge.calls[0]) == 12
    assert judge.calls[0][0] == "Question: What does the word lantern mean?\nAnswer: a lantern holds a light"
    assert judge.calls[0][1] == "Answer: a lantern holds a light"


def test_each_answer_is_scored_once_and_remembered_across_calls() -> None:
    judge = EchoJudge()
    prompt = "What does the word tide mean?"
    pairs = [("the sea", "a tide of the moon"), ("the sea", "nothing here")]
    asyncio.run(evaluation.evaluate([prompt] * 2, pairs, client=judge, method="likelihood"))
    assert sum(len(c) for c in judge.calls) == 2 * 3  # three distinct answers
    again = asyncio.run(
        evaluation.evaluate([prompt], [("the sea", "nothing here")], client=judge, method="likelihood")
    )
    assert again == [1.0] and sum(len(c) for c in judge.calls) == 6  # nothing asked again


def test_an_empty_answer_loses_and_equal_scores_tie() -> None:
    judge = EchoJudge()
    prefs = asyncio.run(
        evaluation.evaluate(
            ["Define the word moon."] * 3,
            [("", "night"), ("  ", ""), ("sun one", "star two")],
            client=judge,
            method="likelihood",
        )
    )
    assert prefs == [0.0, 0.5, 0.5]
    scores = asyncio.run(evaluation.likelihood_scores(judge, [("q?", "")]))
    assert scores == [-math.inf]


def test_a_failing_judge_is_retried_then_left_as_none(monkeypatch: pytest.MonkeyPatch) -> None:
    real_sleep = asyncio.sleep
    monkeypatch.setattr(evaluation.asyncio, "sleep", lambda s: real_sleep(0))  # no backoff in the test
    flaky = EchoJudge(fail=2)
    assert asyncio.run(
        evaluation.evaluate(["Define the word hill."], [("a slope", "x")], client=flaky, method="likelihood")
    ) == [1.0]
    down = EchoJudge(fail=10**6)
    assert asyncio.run(
        evaluation.evaluate(["Define the word dale."], [("a valley", "x")], client=down, method="likelihood")
    ) == [None]
    assert len(down.calls) == evaluation.RETRIES + 1


def test_a_spent_budget_is_not_retried() -> None:
    spent = EchoJudge(
        fail=10**6,
        error=_status_error(
            openai.RateLimitError, 429, {"code": "budget_exceeded", "message": "budget exceeded"}
        ),
    )
    assert asyncio.run(
        evaluation.evaluate(["Define the word vale."], [("a valley", "x")], client=spent, method="likelihood")
    ) == [None]
    assert len(spent.calls) == 1


def test_the_prompted_judge_asks_both_orders_so_a_positional_bias_cancels() -> None:
    judge = ChatJudge()  # always names the answer shown first
    pairs = [(f"first {i}", f"second {i}") for i in range(40)]
    prefs = asyncio.run(
        evaluation.evaluate(["Say something."] * 40, pairs, client=judge, method="prompted", seed=3)
    )
    assert prefs == [0.5] * 40 and len(judge.seen) == 80
    for k, (a, b) in enumerate(pairs):
        assert {shown_answers(p) for p in judge.seen[2 * k: 2 * k + 2]} == {(a, b), (b, a)}
    labels = {labels_of(p) for p in judge.seen}
    assert len(labels) > 10 and all(x in evaluation.LABELS and y in evaluation.LABELS for x, y in labels)
    again = ChatJudge()
    asyncio.run(evaluation.evaluate(["Say something."] * 40, pairs, client=again, method="prompted", seed=3))
    assert again.seen == judge.seen  # the labels are drawn from the seed


def _prefers_good(prompt: str) -> Any:
    """Log-probabilities that favour the answer holding GOOD (0.6 against 0.3), as a real judge's."""
    x, y = labels_of(prompt)
    first, _ = shown_answers(prompt)
    best, other = (x, y) if "GOOD" in first else (y, x)
    return first_token_logprobs((f" {best}", math.log(0.6)), (other, math.log(0.3)), ("The", math.log(0.05)))


def test_the_verdict_is_read_from_the_labels_log_probabilities_not_the_text() -> None:
    judge = ChatJudge(margins=_prefers_good)  # its text always names the first answer: ignored
    prefs = asyncio.run(evaluation.evaluate(
        ["Say hi."] * 4, [("GOOD hi", "bad"), ("bad", "GOOD hello"), ("GOOD", "GOOD too"), ("x", "y")],
        client=judge, method="prompted", seed=1))
    assert prefs == [1.0, 0.0, 0.5, 0.5]


def test_a_label_outside_the_top_log_probabilities_counts_at_the_least_listed() -> None:
    def only_one(prompt: str) -> Any:
        x, _ = labels_of(prompt)
        return first_token_logprobs(("The", math.log(0.5)), (x, math.log(0.2)), ("So", math.log(0.01)))

    # x is listed in both orders, y in neither: each order favours its first answer equally, a tie
    assert asyncio.run(evaluation.evaluate(["q"], [("a1", "b1")], client=ChatJudge(margins=only_one),
                                           method="prompted", seed=0)) == [0.5]


@pytest.mark.parametrize("reply", ["Both are fine.", "Neither is a good answer.", "I cannot help with that."])
def test_an_unreadable_verdict_is_left_out_or_counted_as_the_caller_says(reply: str) -> None:
    def ask(**kw: Any) -> list[float | None]:
        return asyncio.run(evaluation.evaluate(
            ["Say hi."], [("hi", "hello")], client=ChatJudge(reply=reply), method="prompted", seed=0, **kw))

    assert ask() == [None]  # the agent's default: no verdict
    assert ask(unreadable=0.0) == [0.0]  # the scorer's: a loss for the first answer


def test_a_request_refused_for_its_content_takes_the_callers_value() -> None:
    refused = EchoJudge(fail=10**6, error=_status_error(openai.BadRequestError, 400))
    scores = asyncio.run(evaluation.likelihood_scores(refused, [("q?", "an answer")], rejected=-math.inf))
    assert scores == [-math.inf] and len(refused.calls) == 1  # not retried
    assert asyncio.run(evaluation.likelihood_scores(EchoJudge(fail=1, error=_status_error(
        openai.BadRequestError, 400)), [("q?", "an answer")])) == [None]


def test_bad_arguments_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="2 prompts but 1 pairs"):
        asyncio.run(evaluation.evaluate(["a", "b"], [("x", "y")], client=EchoJudge()))
    with pytest.raises(ValueError, match="unknown judge method"):
        asyncio.run(evaluation.evaluate(["a"], [("x", "y")], client=EchoJudge(), method="vibes"))


@pytest.mark.slow
def test_the_offline_judge_through_the_gateway_prefers_the_words_own_definition(tmp_path: Any) -> None:
    """The real thing: Gemma 3 270M's echo log-probabilities through the gateway's socket, as the agent's
    and the scorer's code reach it. Each instruction's own dictionary gloss against another word's."""
    from openrebench.gateway import model_service

    glosses = {"lantern": "A case that holds a light and protects it from the wind.",
               "river": "A large natural stream of water flowing to the sea.",
               "bread": "Food made of flour and water, baked in an oven.",
               "winter": "The coldest season of the year."}
    words = list(glosses)
    prompts = [f'What does the word "{w}" mean?' for w in words]
    pairs = [(glosses[w], glosses[words[(i + 1) % len(words)]]) for i, w in enumerate(words)]
    service = model_service()
    grant = service.grant(tmp_path / "run", {"judge": "local"})
    try:
        transport = httpx.AsyncHTTPTransport(uds=str(grant.socket_path))
        client = openai.AsyncOpenAI(base_url="http://gateway/v1", api_key=grant.token, max_retries=0,
                                    http_client=httpx.AsyncClient(transport=transport, timeout=600))
        prefs = asyncio.run(evaluation.evaluate(prompts, pairs, client=client, method="likelihood"))
        evaluation._SCORES.clear()  # asked again, not remembered
        swapped = asyncio.run(evaluation.evaluate(prompts, [(b, a) for a, b in pairs], client=client,
                                                  method="likelihood"))
    finally:
        service.revoke(grant.token)
    assert prefs == [1.0] * 4, prefs
    assert swapped == [0.0] * 4  # the order the answers come in does not matter
