"""The driver's durable queue: one sqlite file beside the logs, written only by the driver, so that a
driver that stops (Ctrl-C, a crash, a lost laptop) and starts again knows what each attempt did.

Every attempt has one row and a row per try. An attempt is `queued` (not yet handed to Ray), `waiting`
(handed to Ray, not started: Ray's queue, waiting for a node with its GPUs free), `running` (started on
a node), `done` (its score is in its Inspect log in the log directory) or `failed` (out of tries). A
try ends `done`, `failed` (the attempt's own failure, retried up to the eval's retry limit), `lost`
(its node or worker died; retried up to LOST_TRIES times, not counted as a failure) or `interrupted`
(the driver stopped while it ran; restarted, not counted). Changes are committed in batches, one
transaction per turn of the driver's loop.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openrebench.base import OpenRebenchError

from ._spec import AttemptSpec

LOST_TRIES = 3
"""Tries lost to a dead node or worker before the attempt fails: a machine that keeps dying under
one attempt is more likely the attempt's doing (memory) than bad luck."""

STATES = ("queued", "waiting", "running", "done", "failed")
SCHEMA = """
CREATE TABLE IF NOT EXISTS attempts (
    id TEXT PRIMARY KEY, env_id TEXT NOT NULL, epoch INTEGER NOT NULL, spec TEXT NOT NULL,
    position INTEGER NOT NULL, state TEXT NOT NULL, tries INTEGER NOT NULL DEFAULT 0,
    failures INTEGER NOT NULL DEFAULT 0, losses INTEGER NOT NULL DEFAULT 0,
    log TEXT, score REAL, raw REAL, run_dir TEXT, reason TEXT, updated REAL NOT NULL);
CREATE TABLE IF NOT EXISTS tries (
    attempt TEXT NOT NULL, n INTEGER NOT NULL, dir TEXT NOT NULL, submitted REAL NOT NULL,
    started REAL, ended REAL, node TEXT, gpus TEXT, outcome TEXT, reason TEXT,
    PRIMARY KEY (attempt, n));
"""


@dataclass(frozen=True)
class QueuedAttempt:
    """An attempt's row."""

    id: str
    spec: AttemptSpec
    state: str
    tries: int
    failures: int
    losses: int
    log: str | None
    score: float | None
    raw: float | None
    run_dir: str | None
    reason: str | None


@dataclass(frozen=True)
class Try:
    """A try's row: where it ran, when, and how it ended (None while it runs)."""

    attempt: str
    n: int
    dir: str
    submitted: float
    started: float | None
    ended: float | None
    node: str | None
    gpus: list[str]
    outcome: str | None
    reason: str | None


class AttemptQueue:
    """The queue in `path` (made if missing). One driver at a time: the CLI holds a lock beside it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        # The default rollback journal, not WAL: WAL needs shared memory, which network file systems
        # (where a cluster's log directory often lives) do not give.
        self._db = sqlite3.connect(path, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.executescript(SCHEMA)
        self._in_batch = False

    def close(self) -> None:
        self._db.close()

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """One transaction for the changes made inside: durable together, or not at all."""
        if self._in_batch:
            yield
            return
        self._db.execute("BEGIN IMMEDIATE")
        self._in_batch = True
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        else:
            self._db.execute("COMMIT")
        finally:
            self._in_batch = False

    # -- the plan ----------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM attempts").fetchone()[0])

    def plan(self, specs: Iterable[AttemptSpec], resume: bool) -> None:
        """Queue these attempts. A queue that holds attempts already is continued only with `resume`,
        and only over the same attempts (a changed setting is a different attempt: another log dir)."""
        specs = list(specs)
        ids = {s.id for s in specs}
        have = {r[0] for r in self._db.execute("SELECT id FROM attempts")}
        if have and not resume:
            raise OpenRebenchError(f"{self.path} holds the queue of an earlier eval ({len(have)} attempts): "
                                   "pass --resume to continue it, or use another --log-dir")
        if have and have != ids:
            raise OpenRebenchError(f"{self.path} holds a different eval ({len(have - ids)} of its attempts "
                                   f"are not in this one, {len(ids - have)} of these not in it): continue it "
                                   "with the same settings, or use another --log-dir")
        now = time.time()
        with self.batch():
            for position, spec in enumerate(specs):
                self._db.execute("INSERT OR IGNORE INTO attempts (id, env_id, epoch, spec, position, state, "
                                 "updated) VALUES (?, ?, ?, ?, ?, 'queued', ?)",
                                 (spec.id, spec.env_id, spec.epoch, spec.to_json(), position, now))

    def recover(self, retry_failures: int) -> list[Try]:
        """After a driver's restart: the tries that were in flight (returned, still open, for the caller
        to adopt a result they left or to mark interrupted), and failed attempts put back in the queue
        where `retry_failures` (the limit now) allows another try."""
        open_tries = [self._try(r) for r in self._db.execute(
            "SELECT * FROM tries WHERE outcome IS NULL ORDER BY submitted")]
        with self.batch():
            self._db.execute("UPDATE attempts SET state = 'queued', updated = ? WHERE state = 'failed' AND "
                             "failures <= ? AND losses < ?", (time.time(), retry_failures, LOST_TRIES))
        return open_tries

    # -- transitions (inside a batch) ----------------------------------------------------------------------
    def submitted(self, attempt_id: str, try_dir: Path) -> int:
        """A new try handed to Ray: the attempt waits; returns the try's number."""
        (tries,) = self._db.execute("SELECT tries FROM attempts WHERE id = ?", (attempt_id,)).fetchone()
        n = tries + 1
        now = time.time()
        self._db.execute("UPDATE attempts SET state = 'waiting', tries = ?, updated = ? WHERE id = ?",
                         (n, now, attempt_id))
        self._db.execute("INSERT INTO tries (attempt, n, dir, submitted) VALUES (?, ?, ?, ?)",
                         (attempt_id, n, str(try_dir), now))
        return n

    def started(self, attempt_id: str, n: int, started: float, node: str, gpus: list[str]) -> None:
        self._db.execute("UPDATE tries SET started = ?, node = ?, gpus = ? WHERE attempt = ? AND n = ?",
                         (started, node, json.dumps(gpus), attempt_id, n))
        self._db.execute("UPDATE attempts SET state = 'running', updated = ? WHERE id = ? AND "
                         "state = 'waiting'", (time.time(), attempt_id))

    def finished(self, attempt_id: str, n: int, result: dict[str, Any]) -> None:
        """The try scored: the attempt is done (its log is in the log directory)."""
        self._end_try(attempt_id, n, "done", None, result.get("ended"))
        self._db.execute("UPDATE attempts SET state = 'done', log = ?, score = ?, raw = ?, run_dir = ?, "
                         "reason = NULL, updated = ? WHERE id = ?",
                         (result.get("log"), result.get("score"), result.get("raw"), result.get("run_dir"),
                          time.time(), attempt_id))

    def failed(self, attempt_id: str, n: int, reason: str, retry_failures: int,
               result: dict[str, Any] | None = None) -> bool:
        """The attempt's own failure; returns whether it is queued again (else it has failed)."""
        self._end_try(attempt_id, n, "failed", reason, (result or {}).get("ended"))
        (failures,) = self._db.execute("SELECT failures FROM attempts WHERE id = ?", (attempt_id,)).fetchone()
        again = failures + 1 <= retry_failures
        result = result or {}
        self._db.execute("UPDATE attempts SET state = ?, failures = ?, reason = ?, log = ?, run_dir = ?, "
                         "updated = ? WHERE id = ?",
                         ("queued" if again else "failed", failures + 1, reason, result.get("log"),
                          result.get("run_dir"), time.time(), attempt_id))
        return again

    def lost(self, attempt_id: str, n: int, reason: str) -> bool:
        """The try's node or worker died; returns whether it is queued again (else it has failed)."""
        self._end_try(attempt_id, n, "lost", reason)
        (losses,) = self._db.execute("SELECT losses FROM attempts WHERE id = ?", (attempt_id,)).fetchone()
        again = losses + 1 < LOST_TRIES
        final = reason if again else f"{reason} (lost {losses + 1} times)"
        self._db.execute("UPDATE attempts SET state = ?, losses = ?, reason = ?, updated = ? WHERE id = ?",
                         ("queued" if again else "failed", losses + 1, final, time.time(), attempt_id))
        return again

    def interrupted(self, attempt_id: str, n: int, reason: str) -> None:
        """The driver stopped during the try: queued again, uncounted."""
        self._end_try(attempt_id, n, "interrupted", reason)
        self._db.execute("UPDATE attempts SET state = 'queued', updated = ? WHERE id = ?",
                         (time.time(), attempt_id))

    def _end_try(self, attempt_id: str, n: int, outcome: str, reason: str | None,
                 ended: float | None = None) -> None:
        """`ended`: when the try's last command ended on its node (default: now, as the driver learns it)."""
        self._db.execute("UPDATE tries SET ended = ?, outcome = ?, reason = ? WHERE attempt = ? AND n = ?",
                         (ended or time.time(), outcome, reason, attempt_id, n))

    # -- reading ---------------------------------------------------------------------------------------
    def attempts(self, state: str | None = None) -> list[QueuedAttempt]:
        where, args = ("WHERE state = ?", (state,)) if state else ("", ())
        return [self._attempt(r) for r in self._db.execute(
            f"SELECT * FROM attempts {where} ORDER BY position", args)]

    def get(self, attempt_id: str) -> QueuedAttempt:
        row = self._db.execute("SELECT * FROM attempts WHERE id = ?", (attempt_id,)).fetchone()
        return self._attempt(row)

    def tries(self, attempt_id: str | None = None) -> list[Try]:
        where, args = ("WHERE attempt = ?", (attempt_id,)) if attempt_id else ("", ())
        return [self._try(r) for r in self._db.execute(f"SELECT * FROM tries {where} ORDER BY attempt, n",
                                                       args)]

    def counts(self) -> dict[str, Counter[str]]:
        """Attempts per environment and state."""
        out: dict[str, Counter[str]] = {}
        for env_id, state, count in self._db.execute(
                "SELECT env_id, state, count(*) FROM attempts GROUP BY env_id, state ORDER BY env_id"):
            out.setdefault(env_id, Counter())[state] = count
        return out

    @staticmethod
    def _attempt(r: sqlite3.Row) -> QueuedAttempt:
        return QueuedAttempt(id=r["id"], spec=AttemptSpec.from_json(r["spec"]), state=r["state"],
                             tries=r["tries"], failures=r["failures"], losses=r["losses"], log=r["log"],
                             score=r["score"], raw=r["raw"], run_dir=r["run_dir"], reason=r["reason"])

    @staticmethod
    def _try(r: sqlite3.Row) -> Try:
        return Try(attempt=r["attempt"], n=r["n"], dir=r["dir"], submitted=r["submitted"],
                   started=r["started"], ended=r["ended"], node=r["node"],
                   gpus=json.loads(r["gpus"]) if r["gpus"] else [], outcome=r["outcome"], reason=r["reason"])
