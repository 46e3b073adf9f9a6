"""Rust for rust_codecontests: pull the program out of a model's reply, compile it, judge it on tests.

Shared: the scorer uses this package, and the agent's workspace gets a copy (`rust_codecontests_utils/`)
for its evaluate.py and scaffold, so it imports the standard library only (processes: `_limited`). The
scorer runs untrusted programs with it: every rustc and every program runs in a session of its own, killed
as a group when it ends or runs out of time (with whatever it forked and moved out of the group while
holding our pipes), with an environment of PATH (and TMPDIR for rustc) and nothing else of the caller's,
so no keys; stdin from us, stdout capped, rlimits set in the child. Reading the held-out file is what
`prefix` is for: the scorer passes a `setpriv` command that drops to an unprivileged uid, so neither
`include_str!` at compile time nor the program at run time can open a root-only file. The scorer also runs
each test's program in a cgroup of its own (`evaluate_program`'s `run`); here, a process a program forked,
moved to a session of its own and detached from our pipes is left to the sandbox around it, as is rustc's
memory (capped only loosely, COMPILE_DATA_BYTES).

Verdicts follow contest judges: stdout compared after trimming (`outputs_match`), a non-zero exit is a
runtime error even when the output is right, and the wall-clock limit is the problem's time limit.
"""

from __future__ import annotations

import functools
import math
import os
import re
import resource
import shutil
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._limited import run_limited

__all__ = [
    "CompileResult", "ProgramResult", "TestOutcome", "compile_rust", "evaluate_problem", "evaluate_program",
    "extract_rust", "find_rustc", "outputs_match", "run_test",
]

STATUSES = ("passed", "wrong_answer", "timeout", "runtime_error", "memory", "output_limit")
FAILURES = ("compile_error", *STATUSES[1:])

# rustc: --edition 2018 is the paper's. -C debuginfo=0 skips our crate's debug info; codegen-units=1 was
# measured faster on a contest-sized program here (0.58-0.65 s against 0.73-0.80 s for the default 16,
# rustc 1.95) and keeps rustc's CPU time close to its wall time, so the CPU limit below means what it says.
# -A warnings leaves only errors in what a failed compile reports (deny-by-default lints stay errors).
RUSTC_FLAGS = ("--edition", "2018", "-O", "-C", "debuginfo=0", "-C", "codegen-units=1", "--crate-type", "bin",
               "--crate-name", "main", "--color", "never", "-A", "warnings")
COMPILE_FSIZE_BYTES = 64 << 20  # a binary is ~4.5 MB; bounds `include_bytes!` of a huge file, and disk use
# No RLIMIT_AS on rustc (LLVM and jemalloc reserve far more address space than they touch); RLIMIT_DATA counts
# only writable private memory, and a contest program compiles in ~140 MB: 4 GiB stops a const-eval bomb
# from taking the machine while never touching an honest program.
COMPILE_DATA_BYTES = 4 << 30
COMPILE_ERROR_CHARS = 4000  # errors come first; the rest of a long report says nothing new

# Programs: RLIMIT_AS is the memory limit plus this, for the binary, libc and the stack's first pages
# (a hello-world runs under 8 MB of address space). Judges count resident memory, address space is
# stricter: a Vec may reserve up to twice what it holds, and a thread with a huge stack (a Rust idiom for
# deep recursion) reserves all of it; 64 MiB forgives the common cases.
AS_MARGIN_BYTES = 64 << 20
STDERR_SNIPPET_CHARS = 1000
RUN_PATH = "/usr/local/bin:/usr/bin:/bin"  # enough to find a prefix (setpriv); programs need nothing
MEMORY_MARKERS = ("memory allocation of", "out of memory", "cannot allocate memory", "failed to allocate")
PROXY_ENV = ("HOME", "RUSTUP_HOME", "RUSTUP_TOOLCHAIN", "CARGO_HOME")  # only for an unresolved rustup proxy


# ------------------------------------------------------------------------------------------ extraction

_FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([^`]*?)\s*$")
_MAIN = re.compile(r"\bfn\s+main\s*\(")


def _fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of each fenced block in order; an unterminated last block runs to the end."""
    blocks: list[tuple[str, str]] = []
    fence: str | None = None
    lang, body = "", []
    for line in text.splitlines():
        m = _FENCE.match(line)
        if fence is None:
            if m:
                fence, body = m.group(1), []
                words = re.split(r"[\s,{}.]+", m.group(2).lower())
                lang = next((w for w in words if w), "")
        elif m and not m.group(2) and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
            blocks.append((lang, "\n".join(body)))
            fence = None
        else:
            body.append(line)
    if fence is not None:
        blocks.append((lang, "\n".join(body)))
    return blocks


def extract_rust(text: str) -> str:
    """The Rust program in a model's reply.

    Replies often hold a snippet or a sketch before the final program, so the *last* candidate wins, in
    this order: the last fenced block with a `fn main(`; else the last block tagged rust or rs; else the
    last non-empty fenced block of any kind; else, when there is no fence at all, the whole text (a reply
    that is bare code). Fences may be ``` or ~~~, tagged or not, indented, and the last may be
    unterminated (a reply cut off at max_tokens). The result ends with one newline, or is "" when there
    is nothing.
    """
    fenced = _fenced_blocks(text)
    blocks = [(lang, body) for lang, body in fenced if body.strip()]
    with_main = [body for _, body in blocks if _MAIN.search(body)]
    rust = [body for lang, body in blocks if lang in ("rust", "rs")]
    bare = [] if fenced else [text]
    chosen = (with_main or rust or [body for _, body in blocks] or bare or [""])[-1].strip()
    return chosen + "\n" if chosen else ""


def outputs_match(actual: str, expected: str) -> bool:
    """Whether a program's stdout is the expected output.

    Both sides are normalised the same way: line endings to \\n (\\r\\n and lone \\r), trailing whitespace
    removed from every line, then leading and trailing whitespace (blank lines included) removed from the
    whole. Everything else must be equal, inner spacing included. The paper compares trimmed stdout; the
    per-line rule only forgives trailing spaces, which no CodeContests checker counts against anyone.
    """
    return _normal(actual) == _normal(expected)


def _normal(text: str) -> str:
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return "\n".join(line.rstrip() for line in lines).strip()


# -------------------------------------------------------------------------------------------- rustc


def find_rustc() -> str | None:
    """The rustc to compile with: $RUSTC if it names an executable, else `rustc` on PATH, else None.

    The found rustc is replaced by `<sysroot>/bin/rustc` when that exists: a rustup proxy
    (~/.cargo/bin/rustc) needs HOME and RUSTUP_HOME, and fails as the unprivileged uid the scorer compiles
    as; the real compiler needs neither.
    """
    named = os.environ.get("RUSTC")
    found = (shutil.which(named) if named else None) or shutil.which("rustc")
    return None if found is None else _real_rustc(found)


@functools.cache
def _real_rustc(found: str) -> str:
    """`found`'s own compiler binary (asked once per path: the proxy takes ~50 ms to answer)."""
    try:
        out = subprocess.run([found, "--print", "sysroot"], capture_output=True, text=True, timeout=60,
                             stdin=subprocess.DEVNULL, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return found
    real = Path(out) / "bin" / "rustc"
    return str(real) if out and real.is_file() and os.access(real, os.X_OK) else found


def _compile_env(rustc: str, workdir: Path) -> dict[str, str]:
    """PATH (rustc runs `cc` to link) and TMPDIR (its and the linker's scratch stays in workdir); the
    rustup variables only when `rustc` is still the proxy, which cannot run without them."""
    env = {"PATH": os.environ.get("PATH") or os.defpath, "TMPDIR": str(workdir), "LC_ALL": "C"}
    if Path(rustc).resolve().name.startswith("rustup"):
        env.update({k: os.environ[k] for k in PROXY_ENV if k in os.environ})
    return env


# ------------------------------------------------------------------------------------------ compiling


@dataclass(frozen=True)
class CompileResult:
    ok: bool
    error: str  # rustc's report (truncated), or why rustc did not run or finish; "" when ok
    seconds: float
    binary: Path | None = None


async def compile_rust(source: str, workdir: Path, *, timeout_s: float = 30, rustc: str | None = None,
                       prefix: Sequence[str] = ()) -> CompileResult:
    """Compile `source` to workdir/main with rustc (edition 2018, -O).

    rustc runs in workdir, behind `prefix` (the scorer's drop to an unprivileged uid; the caller then has
    made workdir that uid's), in its own session with stdin closed, PATH and TMPDIR for environment, a
    file-size limit (COMPILE_FSIZE_BYTES), a data limit (COMPILE_DATA_BYTES), a CPU limit of twice the
    timeout and 5 s (a backstop: the wall clock kills it first), and is killed with all it started at
    timeout_s.
    """
    t0 = time.monotonic()
    rustc = rustc or find_rustc()
    if rustc is None:
        return CompileResult(False, "no rustc found: install Rust or set $RUSTC", 0.0)
    workdir.mkdir(parents=True, exist_ok=True)
    src, binary = workdir / "main.rs", workdir / "main"
    for stale in (src, binary):  # never follow a link left in workdir, nor run an old binary
        stale.unlink(missing_ok=True)
    fd = os.open(src, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as f:  # a lone surrogate is not our crash
        f.write(source)
    os.chmod(src, 0o644)  # readable by the prefix's uid whatever our umask
    argv = [*prefix, rustc, *RUSTC_FLAGS, "-o", str(binary), str(src)]
    limits = {resource.RLIMIT_FSIZE: COMPILE_FSIZE_BYTES, resource.RLIMIT_DATA: COMPILE_DATA_BYTES,
              resource.RLIMIT_CPU: 2 * math.ceil(timeout_s) + 5, resource.RLIMIT_CORE: 0}
    try:
        done = await run_limited(argv, stdin=None, timeout_s=timeout_s, limits=limits,
                                  env=_compile_env(rustc, workdir), cwd=workdir, stdout_limit=1 << 20)
    except OSError as e:
        return CompileResult(False, f"could not start rustc: {e}", time.monotonic() - t0)
    seconds = time.monotonic() - t0
    report = done.stderr.decode("utf-8", "replace").strip()
    if len(report) > COMPILE_ERROR_CHARS:
        report = report[:COMPILE_ERROR_CHARS] + "\n[... truncated]"
    if done.timed_out:
        return CompileResult(False, f"compilation timed out after {timeout_s:g} s", seconds)
    if done.returncode != 0 or not binary.is_file():
        how = f"rustc exited with {done.returncode}" if (done.returncode or 0) >= 0 else \
            f"rustc killed by {_signal_name(-(done.returncode or 0))}"
        return CompileResult(False, report or how, seconds)
    return CompileResult(True, "", seconds, binary)


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


# -------------------------------------------------------------------------------------------- running


@dataclass(frozen=True)
class TestOutcome:
    __test__ = False  # not a pytest class

    status: str  # one of STATUSES
    seconds: float
    returncode: int | None  # None when it was killed and never reaped; -N: killed by signal N
    stderr: str = ""  # the head of what the program wrote there (a panic message, an allocation failure)

    @property
    def passed(self) -> bool:
        return self.status == "passed"


async def run_test(binary: Path, input_text: str, expected: str, *, timeout_s: float, memory_bytes: int,
                   prefix: Sequence[str] = (), nproc: int | None = None, fsize_bytes: int = 0,
                   nofile: int = 64, stack_bytes: int = 64 << 20, output_limit_bytes: int = 16 << 20,
                   cwd: Path | None = None) -> TestOutcome:
    """Run `binary` on one test and judge it.

    Limits, set in the child before exec (through `prefix`, which execs the program): address space
    memory_bytes + AS_MARGIN_BYTES; CPU ceil(timeout_s) + 1 s (SIGXCPU; SIGKILL a second later);
    files written fsize_bytes (0: none; a write is killed by SIGXFSZ); open files nofile; stack
    stack_bytes (judges allow deep recursion); no core dumps; processes nproc when given. RLIMIT_NPROC
    counts every process and thread of the *real uid*, so it means something only with a prefix to an
    unprivileged uid, and must then exceed the programs that uid runs at once (setuid past the limit makes
    the program's exec fail). Wall clock: timeout_s, then the group is killed. stdout: at most
    output_limit_bytes, then the group is killed ("output_limit"). cwd defaults to the binary's folder.

    The verdict, first that applies: output_limit; timeout (wall clock or SIGXCPU); memory (the program
    said it failed to allocate: Rust aborts with "memory allocation of N bytes failed"); runtime_error
    (a signal or a non-zero exit); wrong_answer; passed.
    """
    limits = {resource.RLIMIT_AS: memory_bytes + AS_MARGIN_BYTES,
              resource.RLIMIT_CPU: math.ceil(timeout_s) + 1, resource.RLIMIT_FSIZE: fsize_bytes,
              resource.RLIMIT_NOFILE: nofile, resource.RLIMIT_STACK: stack_bytes, resource.RLIMIT_CORE: 0}
    if nproc is not None:
        limits[resource.RLIMIT_NPROC] = nproc
    try:
        done = await run_limited([*prefix, str(binary)], stdin=input_text.encode("utf-8"),
                                  timeout_s=timeout_s, limits=limits, env={"PATH": RUN_PATH},
                                  cwd=cwd or binary.parent, stdout_limit=output_limit_bytes)
    except OSError as e:
        return TestOutcome("runtime_error", 0.0, None, f"could not start the program: {e}")
    stderr = done.stderr.decode("utf-8", "replace")
    rc = done.returncode
    if done.overflowed:
        status = "output_limit"
    elif done.timed_out or rc == -signal.SIGXCPU:
        status = "timeout"
    elif rc != 0 and any(m in stderr.lower() for m in MEMORY_MARKERS):
        status = "memory"
    elif rc != 0:
        status = "runtime_error"
    else:
        right = outputs_match(done.stdout.decode("utf-8", "replace"), expected)
        status = "passed" if right else "wrong_answer"
    return TestOutcome(status, round(done.seconds, 4), rc, stderr[:STDERR_SNIPPET_CHARS])


# ------------------------------------------------------------------------------------------- judging


@dataclass
class ProgramResult:
    compiled: bool
    passed: int  # tests passed (in order, until the first failure when stopping at it)
    total: int  # tests the program was to be run on
    solved: bool  # compiled, and passed all of at least one test
    failure: str | None = None  # one of FAILURES (what the scorer counts); None if solved or no tests
    failure_test: int | None = None  # 1-based index of the first failed test
    compile_error: str = ""
    compile_seconds: float = 0.0
    outcomes: list[TestOutcome] = field(default_factory=list)

    @property
    def failure_status(self) -> str | None:
        """The same as `failure` (the machine-friendly verdict); `summary()` is the sentence."""
        return self.failure

    def summary(self) -> str:
        """One line for a person: "solved (5/5 tests)", "compile error: <first error line>",
        "wrong answer on test 2 of 5", ..."""
        if self.solved:
            return f"solved ({self.passed}/{self.total} tests)"
        if not self.compiled:
            lines = [ln.strip() for ln in self.compile_error.splitlines() if ln.strip()]
            first = next((ln for ln in lines if ln.startswith("error")), lines[0] if lines else "")
            return f"compile error: {first}"[:300]
        if self.total == 0:
            return "no tests to run"
        what = (self.failure or "failed").replace("_", " ")
        return f"{what} on test {self.failure_test} of {self.total}"


async def evaluate_program(source: str, tests: Sequence[tuple[str, str]], *, workdir: Path,
                           time_limit_s: float, memory_bytes: int, compile_timeout_s: float = 30,
                           prefix: Sequence[str] = (), stop_on_failure: bool = True, rustc: str | None = None,
                           run: Callable[..., Awaitable[TestOutcome]] = run_test) -> ProgramResult:
    """Compile `source` as given (call extract_rust first on a model's reply) in workdir and run it on
    (input, expected output) tests in order, each with run_test's limits; the first failure ends it
    when stop_on_failure. Safe to run many at once under asyncio.gather, each in its own workdir.
    A source without `fn main(` fails as a compile error without running rustc. `run` runs each test in
    run_test's place, with its arguments (the scorer's puts the program in a cgroup of its own).
    """
    total = len(tests)
    if not _MAIN.search(source):
        return ProgramResult(False, 0, total, False, "compile_error", None,
                             "error: the program has no `fn main()`")
    compiled = await compile_rust(source, workdir, timeout_s=compile_timeout_s, rustc=rustc, prefix=prefix)
    if not compiled.ok or compiled.binary is None:
        return ProgramResult(False, 0, total, False, "compile_error", None, compiled.error,
                             round(compiled.seconds, 3))
    result = ProgramResult(True, 0, total, False, None, None, "", round(compiled.seconds, 3))
    for i, (input_text, expected) in enumerate(tests, 1):
        outcome = await run(compiled.binary, input_text, expected, timeout_s=time_limit_s,
                            memory_bytes=memory_bytes, prefix=prefix, cwd=workdir)
        result.outcomes.append(outcome)
        if outcome.passed:
            result.passed += 1
        elif result.failure is None:
            result.failure, result.failure_test = outcome.status, i
            if stop_on_failure:
                break
    result.solved = total > 0 and result.passed == total
    return result


TEST_GROUPS = ("public_tests", "private_tests", "generated_tests")


def problem_tests(problem: dict[str, Any], include_hidden: bool = True) -> list[tuple[str, str]]:
    """A problem record's (input, output) pairs: public, then private and generated when include_hidden."""
    pairs: list[tuple[str, str]] = []
    for group in TEST_GROUPS if include_hidden else TEST_GROUPS[:1]:
        tests = problem.get(group) or {}
        pairs += list(zip(tests.get("input") or [], tests.get("output") or [], strict=False))
    return pairs


async def evaluate_problem(source: str, problem: dict[str, Any], *, workdir: Path,
                           include_hidden: bool = True, **kw: Any) -> ProgramResult:
    """evaluate_program on a problem record (public_tests, private_tests, generated_tests, time_limit_s,
    memory_limit_bytes); its public tests only when include_hidden is False. `kw` goes to
    evaluate_program and may override the record's limits."""
    kw.setdefault("time_limit_s", float(problem.get("time_limit_s") or 2.0))
    kw.setdefault("memory_bytes", int(problem.get("memory_limit_bytes") or 256 << 20))
    return await evaluate_program(source, problem_tests(problem, include_hidden), workdir=workdir, **kw)
