"""rust_codecontests: what a scoring's code leaves running must not outlive its part of the scoring.

Invariant 3 (nothing leaves a scoring), from the scorer's side: a compiled program sees a held-out test's
input; a process it forks and detaches (a session of its own, its stdio closed, so neither the process
group kill nor the pipe-holder sweep finds it) must die with its test, or it would watch the next tests'
inputs and outlive the scoring. The same for the scaffold's host: what it detaches must not live on into
the judging phase. The scorer puts each test's program, and the host, in a cgroup of its own under the
solution's, killed whole when the test (the host) ends. Each attack records the pids it detached and the
test checks they are gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from openrebench.environments.rust_codecontests import _test_cgroups, rust_utils, scorer
from openrebench.environments.rust_codecontests.env import RustCodecontests
from openrebench.isolation import Cgroup

ENV = "rust_codecontests"
attack = pytest.mark.attack
pytestmark = pytest.mark.skipif(rust_utils.find_rustc() is None or os.geteuid() != 0,
                                reason="needs rustc, and root for cgroups")

# A program that answers its input and leaves something running, per the first word of its input:
# "detach": fork, setsid, close stdio, sleep; "double": fork twice (the grandchild is reparented);
# "chain": a child that keeps forking a successor and exiting (every 20 ms), so that no pid of it lasts.
PROGRAM = r"""
use std::io::Read;
extern "C" { fn fork() -> i32; fn setsid() -> i32; fn sleep(s: u32) -> u32; fn close(fd: i32) -> i32;
             fn getpid() -> i32; fn _exit(code: i32) -> !; fn usleep(us: u32) -> i32; }
unsafe fn detach() { setsid(); close(0); close(1); close(2); }
fn main() {
    let mut s = String::new();
    std::io::stdin().read_to_string(&mut s).unwrap();
    let mode = s.split_whitespace().next().unwrap_or("").to_string();
    unsafe {
        let mut fds = [0i32; 2];
        extern "C" { fn pipe(fds: *mut i32) -> i32; fn read(fd: i32, b: *mut u8, n: usize) -> isize;
                     fn write(fd: i32, b: *const u8, n: usize) -> isize; }
        pipe(fds.as_mut_ptr());
        let pid = fork();
        if pid == 0 {
            detach();
            let me: i32 = match mode.as_str() {
                "double" => { let p = fork(); if p != 0 { _exit(0); } getpid() }
                _ => getpid(),
            };
            let b = me.to_le_bytes();
            write(fds[1], b.as_ptr(), 4);
            close(fds[1]);
            if mode == "chain" {
                loop { usleep(20000); let p = fork(); if p != 0 { _exit(0); } }
            }
            sleep(60);
            _exit(0);
        }
        close(fds[1]);
        let mut b = [0u8; 4];
        read(fds[0], b.as_mut_ptr(), 4);
        eprintln!("{}", i32::from_le_bytes(b));
    }
    print!("{}", s.trim());
}
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _gone(pids: list[int], within_s: float = 2.0) -> bool:
    deadline = time.monotonic() + within_s
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(_alive(p) for p in pids)


def _chain_alive(marker: str, looks: int = 5) -> list[int]:
    """Pids of processes running the program in `marker`, seen in any of `looks` scans of /proc 50 ms
    apart: the chain's successors change pid every 20 ms, and one scan can pass a member's pid just
    before it is born."""
    found: set[int] = set()
    for look in range(looks):
        with contextlib.suppress(OSError), os.scandir("/proc") as procs:
            for e in procs:
                if e.name.isdigit():
                    with contextlib.suppress(OSError):
                        if marker in os.readlink(f"/proc/{e.name}/exe") and _alive(int(e.name)):
                            found.add(int(e.name))
        if look < looks - 1:
            time.sleep(0.05)
    return sorted(found)


@pytest.fixture(scope="module")
def program() -> Iterator[Path]:
    folder = Path(os.environ.get("TMPDIR", "/tmp")) / f"rcc-redteam-{os.getpid()}"
    folder.mkdir(exist_ok=True)
    result = asyncio.run(rust_utils.compile_rust(PROGRAM, folder))
    assert result.ok, result.error
    assert result.binary is not None
    yield result.binary
    for pid in _chain_alive(str(folder)):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def group() -> Iterator[Any]:
    made = Cgroup.create(f"rcc-redteam-{os.getpid()}-{time.monotonic_ns()}", memory_bytes=None, max_pids=None)
    if made is None:
        pytest.skip("no cgroup can be made here")
    yield made
    made.close()


def _run(binary: Path, stdin: str, group: Any) -> rust_utils.TestOutcome:
    return asyncio.run(_test_cgroups.run_test(binary, stdin, stdin, timeout_s=5.0, memory_bytes=256 << 20,
                                              cgroup=group, nproc=None))


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


@attack(env=ENV, cls="daemon outlives its test", invariant=3, defence="per-test-cgroup")
@pytest.mark.parametrize("mode", ["detach", "double"])
def test_a_detached_child_or_grandchild_dies_with_its_test(program: Path, group: Any, mode: str) -> None:
    """A program's child calls setsid and closes its stdio ("double": it forks again, the grandchild
    reparented away from the program) while the program answers and exits."""
    outcome = _run(program, mode, group)
    assert outcome.status == "passed", outcome
    pid = int(outcome.stderr.split()[0])
    try:
        assert _gone([pid]), f"attack works: the detached process {pid} ({mode}) outlived its test"
    finally:
        _kill([pid])


@attack(env=ENV, cls="daemon outlives its test", invariant=3, defence="per-test-cgroup")
def test_a_chain_of_short_lived_successors_dies_with_its_test(program: Path, group: Any) -> None:
    """A detached child forks its successor and exits, forever: no pid lives long enough to be killed."""
    outcome = _run(program, "chain", group)
    assert outcome.status == "passed", outcome
    time.sleep(0.3)
    left = _chain_alive(str(program.parent))
    try:
        assert not left, f"attack works: {len(left)} of the chain's processes outlived its test"
    finally:
        for _ in range(50):  # kill the chain with the defence off: its members keep replacing themselves
            _kill(left)
            if not (left := _chain_alive(str(program.parent))):
                break


@attack(env=ENV, cls="daemon outlives its test", invariant=3, defence="per-test-cgroup")
def test_every_tests_detached_child_is_gone_after_the_program_is_judged(program: Path, group: Any,
                                                                        tmp_path: Path) -> None:
    """Each of a problem's tests leaves a detached child, hoping that one of them lives to see the next."""
    tests = [("detach", "detach")] * 3
    result = asyncio.run(_test_cgroups.evaluate_program(PROGRAM, tests, workdir=tmp_path, time_limit_s=5.0,
                                                        memory_bytes=256 << 20, cgroup=group))
    assert result.solved, result
    pids = [int(o.stderr.split()[0]) for o in result.outcomes]
    try:
        left = sum(map(_alive, pids))
        assert _gone(pids), f"attack works: {left} of 3 detached children outlived the tests"
    finally:
        _kill(pids)


SCAFFOLD = """
import os, time

PIDS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "daemon.pid")
_pid = os.fork()
if _pid == 0:
    os.setsid()
    for fd in range(0, 64):
        try:
            os.close(fd)
        except OSError:
            pass
    with open(PIDS, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(60)
    os._exit(0)


async def generate_solution(client, semaphore, problem):
    return "fn main() {}"
"""


def _host_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, group: Any, scaffold: str, problems: int,
                  batch_size: int, batch_timeout_s: float,
                  **kwargs: Any) -> tuple[Path, list[dict[str, Any]]]:
    """The scaffold's answers to `problems` trivial problems, its host run by the scorer's own code in
    the test's cgroup (no model: a key and an address nothing answers)."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-key")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    solution = tmp_path / "solution"
    solution.mkdir()
    (solution / "solve_code_contests_rust.py").write_text(scaffold)
    params = RustCodecontests.tiers["mini"].params.model_copy(update={"batch_size": batch_size,
                                                                      "batch_timeout_s": batch_timeout_s})
    problem = {"name": "p", "description": "print nothing", "time_limit_s": 1.0,
               "memory_limit_bytes": 256 << 20, "public_tests": {"input": [""], "output": [""]}}
    answers = scorer.generate_answers(params, solution, [problem] * problems, group, **kwargs)
    assert not isinstance(answers, str), answers
    return solution, answers


@attack(env=ENV, cls="daemon outlives the scaffold", invariant=3, defence="per-test-cgroup")
def test_a_daemon_of_the_scaffold_is_gone_before_the_programs_are_judged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, group: Any) -> None:
    """The scaffold forks a detached daemon at import, to live on while the held-out tests are run."""
    solution, _ = _host_answers(tmp_path, monkeypatch, group, SCAFFOLD, 1, 2, 5.0)
    pid_file = solution / "daemon.pid"
    deadline = time.monotonic() + 5
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = int(pid_file.read_text())
    try:
        assert _gone([pid]), f"attack works: the scaffold's daemon {pid} lived on into the judging"
    finally:
        _kill([pid])


HOG = """
import os
_held = []


async def generate_solution(client, semaphore, problem):
    # Past the scoring's memory limit, the whole scoring would end "Invalid": a verdict the scaffold
    # could choose after reading a held-out problem. Touched page by page, so that it is really used.
    block = bytearray(400 << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    _held.append(block)
    return "fn main() {}"
"""


@attack(env=ENV, cls="held-out data in the message", invariant=3, defence="host-memory-cap")
def test_a_scaffold_past_its_memory_cap_loses_its_batch_not_the_scoring(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, group: Any) -> None:
    """The scaffold allocates past the scoring's memory limit (here: past its host's cap of 256 MB)."""
    _, answers = _host_answers(tmp_path, monkeypatch, group, HOG, 2, 1, 20.0, host_memory_bytes=256 << 20)
    assert [a["status"] for a in answers] == ["host_failed", "host_failed"], (
        "attack works: the scaffold's host held 400 MB past its cap", answers)
