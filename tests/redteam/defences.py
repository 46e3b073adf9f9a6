"""Defences the adversarial suite can switch off in-process, to show that their attacks are real.

Each switch replaces, for one pytest session, the code or constant that makes one defence (in the test
process: the scorers called here and the harness pieces the attacks drive). `pytest tests/redteam
--defences-off NAME` runs only the attacks marked `defence=NAME`, which then work; benchmarks/redteam.py
`--defences-off` records one such run per switch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Switch:
    what: str  # the defence, in a few words
    switch_off: Callable[[pytest.MonkeyPatch], None]


def _isolated_host_start(mp: pytest.MonkeyPatch) -> None:
    """Solution hosts start as before class 1 (`python -m`): the working directory, the solution's folder,
    first on the import path, site and PYTHON* variables honoured."""
    from openrebench.api import _protocol

    mp.setattr(_protocol, "HOST_START", ("-B", "-m"))


def _snapshot_counting(mp: pytest.MonkeyPatch) -> None:
    """The snapshot counts as before invariant 7: only folders and regular files are entries (links, FIFOs
    and sockets are free), a file's bytes only as they are read, and each folder is listed whole first."""
    import os
    import stat

    from openrebench.runs import _snapshot

    mp.setattr(_snapshot, "_cost", lambda st: (int(stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)), 0))
    mp.setattr(_snapshot, "_list_names", lambda fd, room: sorted(os.listdir(fd)))


def _per_test_cgroup(mp: pytest.MonkeyPatch) -> None:
    """rust_codecontests' programs and scaffold host run without cgroups of their own (as before)."""
    from openrebench.environments.rust_codecontests import _test_cgroups, scorer

    mp.setattr(_test_cgroups, "_own_group", lambda cgroup: None)
    mp.setattr(scorer, "_sub_group", lambda group, name: None)


def _gateway_reservation(mp: pytest.MonkeyPatch) -> None:
    """The gateway reserves no prompt tokens: only each request's completion cap is held against the
    budget, so a prompt is spent past it (before invariant 6, a guess of bytes / 4 was held)."""
    from openrebench.gateway import _server

    mp.setattr(_server, "prompt_bound", lambda endpoint, body: 0)


def _held_out_server(mp: pytest.MonkeyPatch) -> None:
    """Scorings, and the agent, reach the offline model through one shared server (as before class 3's
    tests of the model server's cache)."""
    from openrebench.gateway import _service

    mp.setattr(_service, "OWN_HELD_OUT_SERVERS", False)


def _reply_cap(mp: pytest.MonkeyPatch) -> None:
    """The gateway holds each request's worst case but ignores the tier's cap on one reply (as before
    `reply_tokens`): a request's own max_tokens, or none, reaches the model."""
    from openrebench.gateway import _grants

    limit = _grants.limit
    mp.setattr(_grants, "limit", lambda *args, reply_cap=None, **kwargs: limit(*args, **kwargs))


def _bounded_rows(mp: pytest.MonkeyPatch) -> None:
    """Rows as before invariant 5's bounds: the message, details and the harness's error texts whole, and
    texts JSON cannot write (lone surrogates) not escaped."""
    from openrebench.runs import _score_log, _scoring

    for module in (_score_log, _scoring):
        mp.setattr(module, "bound_row", lambda row: row)
    mp.setattr(_scoring, "bound_text", lambda text, limit=0: text)


def _own_reserve(mp: pytest.MonkeyPatch) -> None:
    """No blocks kept past the end of the score log: a full disk is met by freeing the reserve file alone,
    whose blocks any run's writes can take."""
    from openrebench.runs import _score_log

    mp.setattr(_score_log, "_keep_tail", lambda fd: False)


def _fresh_line(mp: pytest.MonkeyPatch) -> None:
    """A row is appended right after a torn one, on its line."""
    from openrebench.runs import _score_log

    mp.setattr(_score_log, "_fresh_line", lambda fd: b"")


def _score_socket_cap(mp: pytest.MonkeyPatch) -> None:
    """A run's score socket accepts every connection at once."""
    from openrebench.harness import _score_service

    mp.setattr(_score_service, "MAX_CONNECTIONS", 1 << 30)


def _shown_answers(mp: pytest.MonkeyPatch) -> None:
    """The prompted judge is shown answers as they are (whitespace folded, cut): chat-template tokens,
    section marks and label letters kept."""
    from openrebench.environments.chat_rl import evaluation

    mp.setattr(evaluation, "_shown", evaluation._clean)


def _attempt_disk(mp: pytest.MonkeyPatch) -> None:
    """Attempts without a disk of their own: the agent writes on the machine's disk, as before class 5's
    quota."""
    from openrebench.harness.backends import bwrap

    mp.setattr(bwrap, "volume_problem", lambda: "switched off")


def _scoring_message(mp: pytest.MonkeyPatch) -> None:
    """A scoring's failed model calls as before: every call that failed on the backend's side (a 5xx of
    the offline model's server, the gateway's own 502) is the harness's failure, and the agent is told how
    many calls failed and the first one's text."""
    from openrebench.gateway import ModelService, _likelihood
    from openrebench.harness import _run_models

    async def as_it_came(self: object, error: Exception) -> Exception:
        return error

    def told(rows: list[dict], gateway_lost: bool = False) -> str | None:
        failed = [r for r in rows if r.get("status") in _run_models.BACKEND_FAILED]
        if gateway_lost or not failed:
            return "the model gateway stopped during the scoring" if gateway_lost else None
        first = str(failed[0].get("error") or f"HTTP {failed[0].get('status')}")[:160]
        return (f"the model backend failed on {len(failed)} of {len(rows)} model call(s) during the scoring: "
                f"{first}")

    mp.setattr(_likelihood.LocalModelBackend, "classified", as_it_came)
    mp.setattr(_run_models, "backend_failures", told)
    mp.setattr(ModelService, "answers", lambda *args, **kwargs: False)  # no check of the backend after


def _host_memory_cap(mp: pytest.MonkeyPatch) -> None:
    """rust_codecontests' scaffold host without a memory cap of its own (the scoring's limit alone)."""
    from openrebench.isolation import Cgroup

    mp.setattr(Cgroup, "limit_memory", lambda self, memory_bytes: None)


def _quoted_output(mp: pytest.MonkeyPatch) -> None:
    """optimize_finetune's failure messages end with the pipeline's last output, as before."""
    from openrebench.environments.optimize_finetune import scorer

    mp.setattr(scorer, "_with_tail", lambda message, outcome: f"{message}; its last output:\n{outcome.tail}")


SWITCHES: dict[str, Switch] = {
    "attempt-disk": Switch("each attempt's writable places on a file system of its own size", _attempt_disk),
    "gateway-reservation": Switch("the gateway holds each request's prompt (its bytes bound its tokens) "
                                  "with its completion cap before forwarding it", _gateway_reservation),
    "reply-cap": Switch("the gateway cuts every request of a tier's own models to its reply cap "
                        "(`reply_tokens`)", _reply_cap),
    "bounded-rows": Switch("score-log rows bounded (message, details, texts) to fit the disk reserve",
                           _bounded_rows),
    "fresh-line": Switch("a row after a torn one starts on a fresh line", _fresh_line),
    "host-memory-cap": Switch("rust_codecontests' scaffold host capped below the scoring's memory limit: the "
                              "kernel kills it alone", _host_memory_cap),
    "isolated-host-start": Switch("solution hosts start with python -I, the workspace off the path",
                                  _isolated_host_start),
    "quoted-output": Switch("optimize_finetune's messages quote nothing its pipeline printed",
                            _quoted_output),
    "own-reserve": Switch("each score log keeps its reserve allocated past its own end", _own_reserve),
    "per-test-cgroup": Switch("each rust_codecontests test's program, and the scaffold's host, in a cgroup "
                              "of its own, killed whole when it ends", _per_test_cgroup),
    "held-out-server": Switch("each scoring reaches the offline model through a server of its own, which "
                              "neither the agent nor another scoring reaches (its prompt cache holds "
                              "held-out text)", _held_out_server),
    "judge-shown-answers": Switch("answers shown to the prompted judge without chat-template tokens, section "
                                  "marks or label letters", _shown_answers),
    "scoring-message": Switch("a scoring's failed model calls told in fixed words, and the harness's failure "
                              "only where the backend fails the harness's own request too", _scoring_message),
    "score-socket-cap": Switch("a run's score socket serves at most MAX_CONNECTIONS connections at once",
                               _score_socket_cap),
    "snapshot-counting": Switch("every snapshot entry counts, a file at its apparent size, folders streamed",
                                _snapshot_counting),
}
