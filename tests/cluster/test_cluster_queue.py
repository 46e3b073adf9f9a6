"""The cluster driver's durable queue and attempt plan, without Ray: what a restarted driver finds,
how failures and node losses are counted, and the one-line errors of a bad plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from openrebench.api import OpenRebenchError
from openrebench.cluster import LOST_TRIES, AttemptQueue, AttemptSpec, attempt_resources, plan_attempts


def specs(n: int = 2) -> list[AttemptSpec]:
    return [AttemptSpec(env_id="optimize_kernel", tier="mini", agent="oracle", epoch=e)
            for e in range(1, n + 1)]


def test_an_attempts_id_is_stable_and_changes_with_any_setting() -> None:
    a, b = specs(2)
    assert a.id == AttemptSpec.from_json(a.to_json()).id and a.id != b.id
    assert a.id.startswith("optimize_kernel-mini-oracle-e1-")
    assert a.model_copy(update={"time_limit_s": 600.0}).id != a.id
    react = AttemptSpec(env_id="optimize_kernel", tier="mini", agent="react", model="openai/gpt-4o")
    assert react.id.startswith("optimize_kernel-mini-react-openai_gpt_4o-e1-")


def test_a_queue_is_continued_only_with_resume_and_only_over_the_same_attempts(tmp_path: Path) -> None:
    queue = AttemptQueue(tmp_path / "q.sqlite")
    queue.plan(specs(2), resume=False)
    queue.close()
    again = AttemptQueue(tmp_path / "q.sqlite")
    with pytest.raises(OpenRebenchError, match="pass --resume to continue it"):
        again.plan(specs(2), resume=False)
    with pytest.raises(OpenRebenchError, match="holds a different eval"):
        again.plan(specs(3), resume=True)
    again.plan(specs(2), resume=True)
    assert [a.state for a in again.attempts()] == ["queued", "queued"] and len(again) == 2


def test_failures_are_retried_up_to_the_limit_and_losses_apart_from_them(tmp_path: Path) -> None:
    queue = AttemptQueue(tmp_path / "q.sqlite")
    queue.plan(specs(2), resume=False)
    first, second = (a.id for a in queue.attempts())
    with queue.batch():
        n = queue.submitted(first, tmp_path / "t1")
        assert queue.failed(first, n, "boom", retry_failures=1)  # one retry allowed: queued again
        n = queue.submitted(first, tmp_path / "t2")
        assert not queue.failed(first, n, "boom again", retry_failures=1)
    assert queue.get(first).state == "failed" and queue.get(first).failures == 2
    for k in range(LOST_TRIES):
        with queue.batch():
            n = queue.submitted(second, tmp_path / f"l{k}")
            again = queue.lost(second, n, "node died")
        assert again is (k < LOST_TRIES - 1)
    lost = queue.get(second)
    assert lost.state == "failed" and lost.failures == 0 and f"lost {LOST_TRIES} times" in (lost.reason or "")
    assert [t.outcome for t in queue.tries(second)] == ["lost"] * LOST_TRIES


def test_a_restarted_driver_gets_the_open_tries_and_failed_attempts_back_within_the_new_limit(
        tmp_path: Path) -> None:
    queue = AttemptQueue(tmp_path / "q.sqlite")
    queue.plan(specs(2), resume=False)
    first, second = (a.id for a in queue.attempts())
    with queue.batch():
        queue.failed(first, queue.submitted(first, tmp_path / "a"), "boom", retry_failures=0)
        n = queue.submitted(second, tmp_path / "b")
        queue.started(second, n, 1.0, "node-1", ["0"])
    queue.close()
    restarted = AttemptQueue(tmp_path / "q.sqlite")
    (open_try,) = restarted.recover(retry_failures=0)
    assert (open_try.attempt, open_try.n, open_try.node, open_try.gpus) == (second, 1, "node-1", ["0"])
    assert restarted.get(first).state == "failed"  # the limit still says no
    restarted.recover(retry_failures=1)
    assert restarted.get(first).state == "queued"
    with restarted.batch():
        restarted.interrupted(second, 1, "the driver stopped")
    assert restarted.get(second).state == "queued" and restarted.get(second).failures == 0


def test_a_bad_plan_is_one_line_before_any_cluster_is_asked() -> None:
    with pytest.raises(OpenRebenchError, match="out of range"):
        plan_attempts(["optimize_kernel"], tier="mini", agent="oracle", model=None, epochs=1, time_limit_s=5)
    with pytest.raises(OpenRebenchError, match="unknown isolation 'docker'"):
        plan_attempts(["optimize_kernel"], tier="mini", agent="oracle", model=None, epochs=1,
                      isolation="docker")
    assert len(plan_attempts(["optimize_kernel"], tier="full", agent="oracle", model=None, epochs=3)) == 3


def test_an_attempt_asks_for_its_tiers_gpus_and_the_memory_of_its_sandbox_and_scorer() -> None:
    full, mini = attempt_resources("optimize_kernel", "full"), attempt_resources("optimize_kernel", "mini")
    assert (full.gpus, mini.gpus) == (1, 0) and full.cpus > mini.cpus
    assert full.fits({"CPU": 64, "GPU": 8, "memory": 512 * 1024**3})
    assert not full.fits({"CPU": 64, "GPU": 0, "memory": 512 * 1024**3})
    assert not mini.fits({"CPU": 64, "GPU": 0, "memory": 1024**3})


def test_progress_shows_each_environments_attempts_by_state_and_the_clusters_free_resources(
        tmp_path: Path) -> None:
    from rich.console import Console

    from openrebench.cluster._progress import Progress

    queue = AttemptQueue(tmp_path / "q.sqlite")
    queue.plan([*specs(2), AttemptSpec(env_id="scaling_law", tier="mini", agent="oracle")], resume=False)
    first = queue.attempts()[0].id
    with queue.batch():
        queue.started(first, queue.submitted(first, tmp_path / "t"), 1.0, "node", ["0"])
    console = Console(record=True, width=200)
    with Progress("full", queue, lambda: "cluster: 3 node(s); GPUs 1/3 free", console=console):
        pass
    text = console.export_text()
    assert "waiting for GPUs" in text and "cluster: 3 node(s); GPUs 1/3 free" in text
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:7]]
            for line in text.splitlines() if line.startswith("│")}
    assert rows["optimize_kernel"] == ["1", "0", "1", "0", "0"]  # queued, waiting, running, done, failed
    assert rows["scaling_law"] == ["1", "0", "0", "0", "0"] and rows["all"] == ["2", "0", "1", "0", "0"]
    plain = Console(record=True, width=200)
    Progress("plain", queue, lambda: "cluster: 3 node(s)", console=plain).update()
    assert plain.export_text().strip() == ("2 queued, 0 waiting for GPUs, 1 running, 0 done, 0 failed | "
                                           "cluster: 3 node(s)")


def test_without_ray_the_cluster_option_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from openrebench.cluster import connect

    monkeypatch.setitem(sys.modules, "ray", None)  # as if it were not installed
    with pytest.raises(OpenRebenchError, match=r"--cluster needs Ray: pip install 'openrebench\[ray\]'"):
        connect("local")
