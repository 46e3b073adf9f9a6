"""optimize_finetune's timing counts all the work a solution starts, by cgroup: daemons, double forks,
re-parented processes and zombie leaders whose threads work on are either waited for (their time
counts) or frozen, killed and the scoring invalid; the trusted reference run starts only when nothing
of the solution's is left and reads nothing the solution could have written. Tiny shell scripts stand
in for finetune.sh: they only need to exit."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from openrebench.environments.optimize_finetune import scorer
from openrebench.environments.optimize_finetune.env import CONFIG
from openrebench.environments.optimize_finetune.scorer import Outcome, reference_run, run_pipeline
from openrebench.isolation import Cgroup

WORK_S = 1.5  # how long the left-behind work runs after finetune.sh exits


@pytest.fixture
def group() -> Iterator[Cgroup]:
    made = Cgroup.create("test-finetune", memory_bytes=None, max_pids=None)
    if made is None:
        pytest.skip("no cgroup can be made here (not root, or no cgroup file system)")
    yield made
    made.close()


def pipeline(folder: Path, script: str, group: Cgroup | None, timeout_s: float = 60) -> Outcome:
    folder.mkdir(exist_ok=True)
    (folder / "finetune.sh").write_text(script)
    return run_pipeline(folder, timeout_s, drop=False, cgroup=group)


ZOMBIE_LEADER = f"""
import ctypes, threading, time
def work():
    end = time.monotonic() + {WORK_S}
    while time.monotonic() < end:
        pass
    open("done", "w").write(str(time.monotonic()))
threading.Thread(target=work).start()
ctypes.CDLL(None).pthread_exit(None)  # the leader exits; its thread works on (a zombie leader)
"""

LEFT_BEHIND = {
    # the leader thread exits while another thread works, in a process finetune.sh does not wait for
    "zombie leader": f"cat > z.py <<'PY'\n{ZOMBIE_LEADER}PY\npython3 z.py &\nexit 0\n",
    # a double fork into a new session: re-parented away from finetune.sh at once
    "double fork + setsid": f"( setsid sh -c 'sleep {WORK_S}; echo ok > done' & )\nexit 0\n",
    # a child whose parent exits first (re-parented), its output detached
    "re-parented": (f"bash -c 'nohup sh -c \"sleep {WORK_S}; echo ok > done\" >/dev/null 2>&1 & disown'\n"
                    "exit 0\n"),
}


@pytest.mark.parametrize("name", list(LEFT_BEHIND))
def test_work_left_behind_is_counted(group: Cgroup, tmp_path: Path, name: str) -> None:
    started = time.monotonic()
    outcome = pipeline(tmp_path / "run", LEFT_BEHIND[name], group)
    assert outcome.exit_code == 0 and outcome.stragglers == 0, outcome
    assert (tmp_path / "run" / "done").is_file()  # the work had finished when the clock stopped
    assert outcome.seconds >= WORK_S
    assert outcome.seconds <= time.monotonic() - started
    assert not group.tasks()


def test_work_left_running_is_killed_and_invalid(group: Cgroup, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A daemon burning CPU for good, and a zombie leader whose thread never ends: frozen and killed."""
    monkeypatch.setattr(scorer, "GRACE_S", 1.0)
    forever = ZOMBIE_LEADER.replace(f"{WORK_S}", "1000")
    script = (f"cat > z.py <<'PY'\n{forever}PY\npython3 z.py &\necho $! > zombie.pid\n"
              "( setsid python3 -c 'import os; open(\"burner.pid\", \"w\").write(str(os.getpid()))\n"
              "while True: pass' & )\nsleep 0.3\nexit 0\n")
    outcome = pipeline(tmp_path / "run", script, group)
    assert outcome.exit_code == 0 and outcome.stragglers == 2, outcome
    assert scorer._failure(outcome, 60) is not None and "kept running" in scorer._failure(outcome, 60)
    assert outcome.seconds < 5
    assert not group.tasks()
    for name in ("zombie.pid", "burner.pid"):
        pid = int((tmp_path / "run" / name).read_text())
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_run_past_its_time_limit_is_stopped_whole(group: Cgroup, tmp_path: Path) -> None:
    outcome = pipeline(tmp_path / "run", "( setsid sleep 1000 & )\nsleep 1000\n", group, timeout_s=1)
    assert outcome.exit_code is None and 1 <= outcome.seconds < 4
    assert not group.tasks()


def test_without_a_cgroup_the_process_tree_is_the_fallback(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """No cgroup (unprivileged, no cgroup fs): the subreaper still sees a zombie leader's working thread.
    The grace is long here because what is tested is that the thread is seen and waited for: on a loaded
    machine Python's start-up alone can eat most of the default 5 s, and the wait ends when the work does."""
    monkeypatch.setattr(scorer, "GRACE_S", 60.0)
    # A janitor started while this process is a subreaper (as an earlier scoring leaves it) becomes its
    # child when the shell that started it exits: it is the harness's, not the run's.
    from openrebench.isolation import _janitor

    assert scorer._become_subreaper()
    _janitor.track("dir", tmp_path / "nothing")
    _janitor.untrack("dir", tmp_path / "nothing")
    outcome = pipeline(tmp_path / "run", LEFT_BEHIND["zombie leader"], None)
    assert outcome.exit_code == 0 and outcome.stragglers == 0, outcome
    assert (tmp_path / "run" / "done").is_file() and outcome.seconds >= WORK_S


FAKE_REFERENCE = """#!/usr/bin/env bash
for v in TMPDIR TRITON_CACHE_DIR TORCHINDUCTOR_CACHE_DIR HF_HOME XDG_CACHE_HOME CUDA_CACHE_PATH HOME; do
  echo "$v=${!v}"
done
echo "HOMEMODE=$(stat -c %u:%a "$HOME")"
python3 - <<'PY'
import os, tempfile
print("gettempdir=" + tempfile.gettempdir())
for v in ("TMPDIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "HF_HOME", "XDG_CACHE_HOME"):
    print("listing", v, sorted(os.listdir(os.environ[v])))
print("inputs", sorted(os.listdir(".")), os.path.realpath("initial_model"))
PY
"""


def test_the_reference_run_reads_nothing_the_solution_wrote(group: Cgroup, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The solution's run poisons the shared temporary folder's Triton and Inductor caches and leaves a
    CPU burner; the reference run (a stand-in that reports its environment) starts with nothing of the
    solution's alive, in a fresh root-only home whose caches are empty."""
    shared = tmp_path / "shared-tmp"  # stands for the scoring sandbox's /tmp
    shared.mkdir(mode=0o1777)
    monkeypatch.setattr("tempfile.tempdir", str(shared))
    monkeypatch.setenv("TMPDIR", str(shared))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(shared / "triton"))  # as the scoring sandbox sets it
    monkeypatch.setattr(scorer, "GRACE_S", 1.0)
    poison = (f"mkdir -p {shared}/triton/abc {shared}/torchinductor_root\n"
              f"echo POISON > {shared}/triton/abc/kernel.so; echo POISON > {shared}/torchinductor_root/x\n"
              "( setsid python3 -c 'while True: pass' & )\nexit 0\n")
    outcome = pipeline(tmp_path / "solution", poison, group)
    assert outcome.stragglers == 1 and not group.tasks()

    protected = tmp_path / "protected"
    (protected / "reference").mkdir(parents=True)
    (protected / "reference" / "finetune.sh").write_text(FAKE_REFERENCE)
    (protected / CONFIG).write_text("seed: 1\n")
    for name in ("initial_model", "tokenizer"):
        (protected / name).mkdir()
    with reference_run(protected, 5, ['{"prompt": "a", "response": "b"}\n'], 60, threads=1,
                       cgroup=group) as (ref, weights):
        assert ref.exit_code == 0, ref.tail
        lines = dict(line.split("=", 1) for line in ref.tail.splitlines() if "=" in line and " " not in line)
        home = Path(lines["HOME"])
        assert lines["HOMEMODE"] == "0:700"  # fresh, root-only
        for v in ("TMPDIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "HF_HOME", "XDG_CACHE_HOME",
                  "CUDA_CACHE_PATH", "gettempdir"):
            assert Path(lines[v]).is_relative_to(home), (v, lines[v])
        assert not any(word in ref.tail for word in ("POISON", "kernel.so", "torchinductor_root"))
        for v in ("TMPDIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "HF_HOME"):
            assert f"listing {v} []" in ref.tail, ref.tail
        assert f"'finetune.sh', '{CONFIG}', 'finetune_data.jsonl', 'initial_model', 'tokenizer'" in ref.tail
        assert str(protected / "initial_model") in ref.tail
        assert weights.parent.stat().st_mode & 0o077 == 0
    assert not group.tasks()


def test_cgroup_freeze_thaw_and_kill_all(group: Cgroup) -> None:
    """A counting process in a frozen group makes no progress; thawed it goes on; kill_all empties the
    group even while its processes fork."""
    import subprocess

    counter = subprocess.Popen([*group.enter_prefix(), "python3", "-c",
                                "import itertools, sys\nfor i in itertools.count():\n"
                                "    sys.stdout.write(f'{i}\\n'); sys.stdout.flush()"],
                               stdout=subprocess.DEVNULL, start_new_session=True)  # no full pipe to block on
    try:
        time.sleep(0.3)
        pid = counter.pid
        assert pid in group.pids() and group.tasks()
        if not group.can_freeze:
            pytest.skip("no freezer in this cgroup")
        assert group.freeze()
        before = psutil.Process(pid).cpu_times().user
        time.sleep(0.5)
        assert psutil.Process(pid).cpu_times().user == before
        assert group.thaw()
        time.sleep(0.5)
        assert psutil.Process(pid).cpu_times().user > before
        subprocess.Popen([*group.enter_prefix(), "sh", "-c", "while :; do sleep 10 & done"],
                         start_new_session=True)
        time.sleep(0.3)
        assert group.kill_all() and not group.tasks()
    finally:
        counter.kill()
        counter.wait()


def test_a_v2_group_freezes_and_empties(tmp_path: Path) -> None:
    """The v2 interface (cgroup.freeze, cgroup.threads), where a v2 hierarchy is mounted."""
    import subprocess

    root = next((p for p in (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))
                 if (p / "cgroup.controllers").is_file()), None)
    parent = Cgroup.attach([root]) if root else None
    if parent is None or os.geteuid() != 0:
        pytest.skip("no v2 hierarchy this process may write")
    try:
        group = parent.child(f"openrebench-test-{os.getpid()}")
    except OSError:
        pytest.skip("no v2 group can be made here")
    try:
        assert group.version == "v2" and group.can_freeze
        proc = subprocess.Popen([*group.enter_prefix(), "sh", "-c", "sleep 1000 & sleep 1000"],
                                start_new_session=True)
        time.sleep(0.3)
        assert len(group.pids()) == 3 and len(group.tasks()) == 3  # the shell and two sleeps
        assert group.freeze() and group.thaw()
        assert group.kill_all() and group.wait_empty(1)
        proc.wait()
    finally:
        group.close()
    assert not (root / f"openrebench-test-{os.getpid()}").exists()
