"""The rust_codecontests scorer: the agent's scaffold answers the held-out problems, the scorer judges.

Two phases, never overlapping. First the scaffold runs in the solution host (an unprivileged process
whose only way out is the model gateway, on this scoring's own budget) over the held-out problems in
batches, each cut off at its time; it is given what a contestant sees of a problem (description, public
tests, limits) and never the hidden tests. Then the host is gone and the scorer compiles each answer
with rustc (edition 2018) and runs it on the problem's public, private and generated tests, each
program and each compile as an unprivileged uid with CPU, memory, process, file-size and output limits,
in a folder of its own: neither can read the held-out file (root-only), and no test's expected output
is ever in a file or a process they can reach. A problem is solved when its program passes every test
(stdout compared after trimming whitespace at both ends). Where the scorer has a cgroup for the solution
(`solution_cgroup`), the scaffold's host and each test's program run in sub-groups of their own, killed
whole when the host is done and when the test ends: a process a program forks into a session of its own,
its pipes closed, does not live on to see the next test's input.

The agent is told counts only: its scaffold saw held-out problems, so nothing it raised or printed
while answering them (which could quote them) reaches the message; `evaluate.py` on the validation
split is where it debugs.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from openrebench.api import (
    ScoreResult,
    SolutionError,
    SolutionProcess,
    TierSpec,
    solution_cgroup,
    solution_prefix,
    solution_uid,
)

from . import _test_cgroups, rust_utils
from .params import RustCodecontestsParams
from .problems import public_view, read_jsonl

HOST = "openrebench.environments.rust_codecontests._host"
TEST_FILE = "test.jsonl"


def _program_prefix() -> list[str]:
    """In the scoring sandbox the scorer is root (to read protected/): rustc and the programs must not be
    (a program could `include_str!` the held-out file at compile time, or read it when run)."""
    return solution_prefix()


def grace_s(batch_timeout_s: float) -> float:
    """Beyond a batch's time, for the host to cut its tasks off and answer: a host silent after this has
    hung (blocking code in the event loop), and its batch counts as unanswered."""
    return 5.0 + 0.1 * batch_timeout_s


def _sub_group(group: Any, name: str) -> Any:
    """A fresh sub-group of the solution's cgroup, or None where there is none (or none can be made)."""
    if group is None:
        return None
    try:
        return group.child(f"{name}-{os.getpid()}-{time.monotonic_ns()}")
    except OSError:
        return None


# The scaffold's host may use this share of the scoring's memory: past it the kernel kills the host alone
# (its batch counts as unanswered, a hidden outcome), before the scoring's own limit would end the scoring
# as invalid, which would let a scaffold choose "invalid" after reading held-out problems.
HOST_MEMORY_SHARE = 0.75


def _start_host(solution: Path, params: RustCodecontestsParams, group: Any = None,
                memory_bytes: int | None = None) -> SolutionProcess | str:
    own = _sub_group(group, "scaffold")
    if own is not None and memory_bytes:
        with contextlib.suppress(OSError):  # the scoring's own limit still holds
            own.limit_memory(memory_bytes)
    host = SolutionProcess(HOST, solution, cgroup=own)
    try:
        host.receive(params.import_timeout_s, "importing solve_code_contests_rust.py")
    except SolutionError as e:
        host.close()
        return str(e)
    return host


def _checked(reply: Any, n: int) -> list[dict[str, Any]]:
    """The host's answers for a batch of `n`, trusting nothing of their shape."""
    results = reply.get("results") if isinstance(reply, dict) else None
    if not isinstance(results, list) or len(results) != n:
        return [{"status": "host_failed"}] * n
    out = []
    for r in results:
        if isinstance(r, dict) and r.get("status") == "answered" and isinstance(r.get("source"), str):
            # (a str may hold lone surrogates, which no file can: rustc then sees U+FFFD, a compile error)
            out.append({"status": "answered", "source": r["source"].encode("utf-8", "replace").decode()})
        elif isinstance(r, dict) and r.get("status") in ("timeout", "raised", "not_a_string"):
            out.append({"status": r["status"]})
        else:
            out.append({"status": "host_failed"})
    return out


def _end_solution_processes() -> None:
    """Kill whatever the scaffold left running (a process in a session of its own outlives the host's
    process group), so that nothing of it lives while the programs are judged: every process of the
    solution uid. Only inside the scoring sandbox, whose PID namespace holds nothing else of that uid
    (outside it, the same uid runs the agent's commands)."""
    try:
        in_sandbox = Path("/proc/1/comm").read_text().strip() == "bwrap"
    except OSError:
        in_sandbox = False
    prefix = _program_prefix()
    if not (prefix and in_sandbox):
        return
    subprocess.run([*prefix, sys.executable, "-c", "import os, signal; os.kill(-1, signal.SIGKILL)"],
                   stdin=subprocess.DEVNULL, capture_output=True, timeout=30, check=False)


def generate_answers(params: RustCodecontestsParams, solution: Path, problems: list[dict[str, Any]],
                     group: Any = None, host_memory_bytes: int | None = None) -> list[dict[str, Any]] | str:
    """The scaffold's answer to every problem, batch by batch; a one-line reason where the module cannot
    be loaded at all. A batch whose host hangs or dies (of its memory cap, say) counts as unanswered, and
    the next batch gets a fresh host."""
    host = _start_host(solution, params, group, host_memory_bytes)
    if isinstance(host, str):
        return host
    answers: list[dict[str, Any]] = []
    try:
        for start in range(0, len(problems), params.batch_size):
            batch = problems[start:start + params.batch_size]
            if host is None:
                started = _start_host(solution, params, group, host_memory_bytes)
                if isinstance(started, str):  # it loaded before: the batch failed, not loading
                    answers += [{"status": "host_failed"}] * len(batch)
                    continue
                host = started
            request = {"problems": [public_view(p) for p in batch], "timeout_s": params.batch_timeout_s,
                       "concurrency": params.concurrency}
            try:
                wait = params.batch_timeout_s + grace_s(params.batch_timeout_s)
                reply = host.request(request, wait, "a batch")
            except SolutionError:  # hung or died: its output may quote the problems, so none of it is kept
                host.close()
                host = None
                answers += [{"status": "host_failed"}] * len(batch)
                continue
            answers += _checked(reply, len(batch))
    finally:
        if host is not None:
            host.close()
        _end_solution_processes()
    return answers


async def _judge(source: str, problem: dict[str, Any], params: RustCodecontestsParams, prefix: list[str],
                 slots: asyncio.Semaphore, group: Any = None) -> str:
    async with slots:
        workdir = Path(tempfile.mkdtemp(prefix="rcc-"))
        try:
            if prefix and (uid := solution_uid()) is not None:
                os.chown(workdir, uid, uid)
            result = await _test_cgroups.evaluate_program(
                source, rust_utils.problem_tests(problem), workdir=workdir,
                time_limit_s=float(problem["time_limit_s"]), memory_bytes=int(problem["memory_limit_bytes"]),
                compile_timeout_s=params.compile_timeout_s, prefix=prefix, cgroup=group)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    if not result.compiled:
        return "compile_error"
    return "solved" if result.solved else (result.failure_status or "wrong_answer")


async def judge_all(answers: list[dict[str, Any]], problems: list[dict[str, Any]],
                    params: RustCodecontestsParams, group: Any = None) -> list[str]:
    prefix = _program_prefix()
    slots = asyncio.Semaphore(params.test_workers)

    async def one(answer: dict[str, Any], problem: dict[str, Any]) -> str:
        if answer["status"] != "answered":
            return answer["status"]
        return await _judge(answer["source"], problem, params, prefix, slots, group)

    return list(await asyncio.gather(*(one(a, p) for a, p in zip(answers, problems, strict=True))))


def score(spec: TierSpec[RustCodecontestsParams], solution: Path, protected: Path) -> ScoreResult:
    params = spec.params
    if rust_utils.find_rustc() is None:
        return ScoreResult.invalid("Invalid: infrastructure failure (the scorer found no rustc: install Rust "
                                   "on the host), not caused by your solution.", infrastructure=True)
    problems = read_jsonl(protected / TEST_FILE)
    t0 = time.monotonic()
    group = solution_cgroup()
    try:
        answers = generate_answers(params, solution, problems, group,
                                   int(HOST_MEMORY_SHARE * spec.memory_limit_gb * 2**30))
        if isinstance(answers, str):
            return ScoreResult.invalid(f"Invalid: {answers}")
        t1 = time.monotonic()
        outcomes = asyncio.run(judge_all(answers, problems, params, group))
        t2 = time.monotonic()
    finally:
        if group is not None:
            group.close()
    n, solved = len(problems), outcomes.count("solved")
    p = solved / n
    se = math.sqrt(p * (1 - p) / n)
    counts = Counter(outcomes)
    # The paper's message: counts only. How each other problem failed stays in the hidden details: the
    # scaffold reads every held-out statement and could pick each problem's way of failing (raise,
    # time out, return a non-string...), making the breakdown a channel for the held-out set.
    message = (f"Valid: {solved} of {n} held-out problems solved ({p:.3f}, standard error {se:.3f}). "
               "How the others failed, and what the scaffold raised or printed on held-out problems, is "
               "not shown: debug with evaluate.py on the validation problems.")
    return ScoreResult(raw=p, message=message, details={
        "n_successes": solved, "n_problems": n, "standard_error": se, "outcomes": dict(counts),
        "by_problem": {str(pr.get("name")): o for pr, o in zip(problems, outcomes, strict=True)},
        "generate_s": round(t1 - t0, 2), "judge_s": round(t2 - t1, 2)})
