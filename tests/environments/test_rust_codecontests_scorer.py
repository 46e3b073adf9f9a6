"""rust_codecontests' scorer end to end, with stub scaffolds (no model is ever called) and the real rustc:
what each kind of answer counts as, what the agent is told (counts, never what its scaffold printed or
raised on held-out problems), invalid imports, hostile Rust programs, and what the unprivileged uid of
the scoring sandbox keeps from the scaffold and its programs (the held-out file).

Small on purpose (two shared cores): batches of 3 cut off at 3 s, a handful of compiles per test."""

from __future__ import annotations

import asyncio
import copy
import json
import math
import os
import re
import shutil
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import rust_support
from openrebench.api import ScoreResult, TierSpec
from openrebench.environments.rust_codecontests import problems, rust_utils, scorer
from openrebench.environments.rust_codecontests.env import RustCodecontests
from openrebench.environments.rust_codecontests.params import RustCodecontestsParams
from openrebench.isolation import bwrap_usable
from rust_support import needs_root, open_dir

pytestmark = pytest.mark.skipif(rust_utils.find_rustc() is None, reason="needs rustc")

MODULE = "solve_code_contests_rust.py"
BATCH_TIMEOUT_S = 3.0


def _spec() -> TierSpec[RustCodecontestsParams]:
    spec = RustCodecontests.tiers["mini"]
    params = spec.params.model_copy(update={"batch_size": 3, "batch_timeout_s": BATCH_TIMEOUT_S,
                                            "concurrency": 3, "test_workers": 2, "import_timeout_s": 60})
    return spec.model_copy(update={"params": params})


SPEC = _spec()
PARAMS = SPEC.params
TEST = {p["family"]: p for p in problems.mini_problems(0)[1]}


def _rust(expr: str) -> str:
    """A program that reads stdin's integers into `v` (the text into `s`) and prints `expr`."""
    return ("use std::io::Read;\n"
            "fn main() {\n"
            "    let mut s = String::new();\n"
            "    std::io::stdin().read_to_string(&mut s).unwrap();\n"
            "    let v: Vec<i64> = s.split_whitespace().map(|w| w.parse().unwrap()).collect();\n"
            f"    println!(\"{{}}\", {expr});\n"
            "}\n")


CORRECT = {
    "product": _rust("v[0] * v[1]"),
    "square": _rust("v[0] * v[0]"),
    "min_three": _rust("v[0].min(v[1]).min(v[2])"),
    "gcd": _rust("{ let (mut a, mut b) = (v[0], v[1]); while b != 0 { let t = a % b; a = b; b = t; } a }"),
    "divisible": _rust('if v[0] % v[1] == 0 { "YES" } else { "NO" }'),
    "product_plus": _rust("v[0] * v[1] + v[2]"),
}


def _model_env(mp: pytest.MonkeyPatch) -> None:
    """The host makes an openai client, which wants a key and an address; no stub here calls it."""
    mp.setenv("OPENAI_API_KEY", "sk-test-not-a-key")
    mp.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")


def _solution(folder: Path, code: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MODULE).write_text(code)
    (folder / MODULE).chmod(0o644)
    return folder


def _protected(folder: Path, records: list[dict[str, Any]]) -> Path:
    problems.write_jsonl(folder / scorer.TEST_FILE, records)
    return folder


# --------------------------------------------------------------------- 1. one mixed scoring

SAID = "scaffold-said-6b1e0c"  # printed to stdout and stderr for every held-out problem
RAISED = "scaffold-raised-93d7aa"  # in the text of what the scaffold raises

# (family, outcome) in the order of test.jsonl, so in batches of 3:
MIXED = [
    ("product", "solved"), ("square", "solved"), ("sign", "wrong_answer"),
    ("rectangle", "compile_error"), ("power_of_two", "raised"), ("factorial", "not_a_string"),
    ("count_digits", "timeout"), ("min_three", "solved"), ("remainder", "runtime_error"),
    # sum_three blocks the host's event loop: the whole batch is lost, answers ready or not
    ("sum_three", "host_failed"), ("divisible", "host_failed"), ("product_plus", "host_failed"),
    ("gcd", "solved"),  # a fresh host answers the next batch
]

MIXED_PROGRAMS = {
    **CORRECT,
    "sign": _rust('"positive"'),  # compiles, wrong on n <= 0
    "rectangle": 'fn main() {\n    let x: i32 = "not a number";\n    println!("{}", x);\n}\n',
    "remainder": _rust("v[7]"),  # two numbers in the input: index out of bounds, a panic
}

MIXED_SCAFFOLD = textwrap.dedent("""
    import asyncio
    import sys
    import time

    PROGRAMS = @PROGRAMS@
    SAID = @SAID@
    RAISED = @RAISED@
    print(SAID, "at import", flush=True)
    print(SAID, "at import", file=sys.stderr, flush=True)


    async def generate_solution(client, semaphore, problem):
        name = problem["name"]
        family = name[len("mini-"):name.rindex("-")]
        print(SAID, name, problem["description"], flush=True)
        print(SAID, name, problem["public_tests"], file=sys.stderr, flush=True)
        if "private_tests" in problem or "generated_tests" in problem:
            return "the scaffold was given hidden tests"  # not a program: a compile error
        if family == "power_of_two":
            raise RuntimeError(RAISED + " " + problem["description"])
        if family == "factorial":
            return 42
        if family == "count_digits":
            await asyncio.sleep(100)
        if family == "sum_three":
            time.sleep(100)  # blocks the event loop: the host cannot answer
        return PROGRAMS[family]
""").replace("@PROGRAMS@", repr(MIXED_PROGRAMS)).replace("@SAID@", repr(SAID)).replace(
    "@RAISED@", repr(RAISED))


def _n_batches(n: int) -> int:
    return math.ceil(n / PARAMS.batch_size)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> tuple[ScoreResult, float]:
    """One scoring of the mixed scaffold (as the caller: the uid drop is tested below), and its seconds."""
    root = tmp_path_factory.mktemp("mixed")
    solution = _solution(root / "solution", MIXED_SCAFFOLD)
    protected = _protected(root / "protected", [TEST[f] for f, _ in MIXED])
    with pytest.MonkeyPatch.context() as mp:
        _model_env(mp)
        mp.setenv("OPENREBENCH_HOME", str(root / "home"))
        mp.delenv("OPENREBENCH_SOLUTION_UID", raising=False)
        t0 = time.monotonic()
        result = scorer.score(SPEC, solution, protected)
        return result, time.monotonic() - t0


def test_mixed_scaffold_each_problem_s_outcome(mixed: tuple[ScoreResult, float]) -> None:
    result, _ = mixed
    assert result.raw is not None, result.message
    expected = {TEST[f]["name"]: outcome for f, outcome in MIXED}
    assert result.details["by_problem"] == expected


def test_mixed_scaffold_score_is_the_share_solved(mixed: tuple[ScoreResult, float]) -> None:
    result, _ = mixed
    n, solved = len(MIXED), sum(outcome == "solved" for _, outcome in MIXED)
    assert (n, solved) == (13, 4)
    p = solved / n
    assert result.raw == p
    assert result.details["n_successes"] == solved
    assert result.details["n_problems"] == n
    assert result.details["standard_error"] == pytest.approx(math.sqrt(p * (1 - p) / n), abs=1e-12)
    assert result.details["outcomes"] == {"solved": 4, "wrong_answer": 1, "compile_error": 1, "raised": 1,
                                          "not_a_string": 1, "timeout": 1, "runtime_error": 1,
                                          "host_failed": 3}


def test_mixed_scaffold_message_gives_counts_only(mixed: tuple[ScoreResult, float]) -> None:
    result, _ = mixed
    n, p = len(MIXED), 4 / len(MIXED)
    se = math.sqrt(p * (1 - p) / n)
    assert result.message.startswith(f"Valid: 4 of 13 held-out problems solved ({p:.3f}, standard error "
                                     f"{se:.3f}). "), result.message
    # how the others failed is hidden: the scaffold could choose it per held-out problem (a channel)
    failures = [o for o in result.details["outcomes"] if o != "solved"]
    assert len(failures) == 7
    for outcome in failures:  # no "3 host failed", "1 raised", ...
        assert not re.search(rf"\d+ {outcome.replace('_', ' ')}", result.message), result.message
    assert "\n" not in result.message


def test_mixed_scaffold_output_and_exceptions_never_reach_the_agent(mixed: tuple[ScoreResult, float]) -> None:
    result, _ = mixed
    details = json.dumps(result.details)
    for marker in (SAID, RAISED):
        assert marker not in result.message
        assert marker not in details
    # nor anything of the statements the scaffold printed and raised with
    for family, _ in MIXED:
        assert TEST[family]["description"].splitlines()[0] not in result.message + details


def test_mixed_scoring_takes_bounded_time(mixed: tuple[ScoreResult, float]) -> None:
    """The hung host is given up at batch time + grace, not waited for (it sleeps 100 s)."""
    result, seconds = mixed
    wait = PARAMS.batch_timeout_s + scorer.grace_s(PARAMS.batch_timeout_s)
    assert seconds < _n_batches(len(MIXED)) * wait + 30, result.details
    # the timeout batch ran to its cut-off and the hung one to its grace: both were really waited for
    assert result.details["generate_s"] >= PARAMS.batch_timeout_s + wait - 0.1
    assert result.details["generate_s"] < 100


# ------------------------------------------------------------------- 2. scaffolds that cannot load

IMPORT_FAILURES: dict[str, tuple[str | None, str]] = {
    "missing file": (None, f"{MODULE} is missing from the workspace"),
    "syntax error": ("async def generate_solution(client, semaphore, problem)\n    return ''\n",
                     f"{MODULE} failed to import: SyntaxError"),
    "raises at import": ("raise RuntimeError('no scaffold today')\n",
                         f"{MODULE} failed to import: RuntimeError: no scaffold today"),
    "sys.exit at import": ("import sys\nsys.exit(3)\n", f"{MODULE} failed to import: SystemExit: 3"),
    "os._exit at import": ("import os\nos._exit(7)\n", "the solution process exited with code 7"),
    "no generate_solution": ("async def solve(client, semaphore, problem):\n    return ''\n",
                             "must define `async def generate_solution(client, semaphore, problem) -> str`"),
    "not async": ("def generate_solution(client, semaphore, problem):\n    return ''\n",
                  "must define `async def generate_solution(client, semaphore, problem) -> str`"),
    "not a function": ("generate_solution = 'fn main() {}'\n",
                       "must define `async def generate_solution(client, semaphore, problem) -> str`"),
}


@pytest.mark.parametrize("case", IMPORT_FAILURES)
def test_a_scaffold_that_cannot_load_is_invalid_with_one_clear_line(
        case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, expected = IMPORT_FAILURES[case]
    _model_env(monkeypatch)
    monkeypatch.delenv("OPENREBENCH_SOLUTION_UID", raising=False)
    solution = tmp_path / "solution"
    solution.mkdir()
    if code is not None:
        _solution(solution, code)
    protected = _protected(tmp_path / "protected", [TEST["product"]])
    result = scorer.score(SPEC, solution, protected)
    assert result.raw is None
    first = result.message.split("\n")[0]
    assert first.startswith("Invalid: "), result.message
    assert expected in first, result.message
    assert "Traceback" not in first
    assert result.details.get("infrastructure") is not True


# ------------------------------------------------ the scoring sandbox's unprivileged uid (as root)



@pytest.fixture(scope="module")
def nobody_rustc() -> Iterator[str]:
    with rust_support.nobody_rustc() as rustc:
        yield rustc


@pytest.fixture
def dropping(nobody_rustc: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """As in the scoring sandbox: root, told to run the solution's code (and rustc, and programs) as 65534."""
    monkeypatch.setenv("OPENREBENCH_SOLUTION_UID", "65534")
    monkeypatch.setenv("RUSTC", nobody_rustc)
    _model_env(monkeypatch)


def _judge(sources: list[str], probs: list[dict[str, Any]]) -> list[str]:
    answers = [{"status": "answered", "source": s} for s in sources]
    return asyncio.run(scorer.judge_all(answers, probs, PARAMS))


def _program_pids() -> set[int]:
    """Processes running a binary the scorer compiled (`<tmp>/rcc-*/main`)."""
    prefix = os.path.join(tempfile.gettempdir(), "rcc-")
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv0 = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            except OSError:
                continue
            if argv0.startswith(prefix) and argv0.endswith("/main"):
                found.add(int(entry))
    return found


# ------------------------------------------------------------------- 3. hostile Rust programs

LOOP = "fn main() {\n    let mut x: u64 = 0;\n    loop { x = std::hint::black_box(x.wrapping_add(1)); }\n}\n"
ALLOC = textwrap.dedent("""
    fn main() {
        let mut v = vec![0u8; 2 << 30];
        for i in (0..v.len()).step_by(4096) { v[i] = 1; }
        println!("{}", v.iter().map(|&b| b as u64).sum::<u64>());
    }
""")
# 2^8 processes, half of them in sessions of their own (out of the program's process group), all waiting.
# Bounded: in-process there is no process limit for 65534 (the scoring sandbox's cgroup is that limit).
FORKS = textwrap.dedent("""
    extern "C" { fn fork() -> i32; fn setsid() -> i32; fn pause() -> i32; fn getpid() -> i32; }
    fn main() {
        for _ in 0..8 { unsafe { fork(); } }
        unsafe { if getpid() % 2 == 0 { setsid(); } loop { pause(); } }
    }
""")


def _writer(*targets: Path) -> str:
    """Prints the right product only if one of its writes succeeded."""
    writes = " || ".join(f'std::fs::write("{t}", "pwned").is_ok()' for t in targets)
    return _rust(f'if {writes} {{ (v[0] * v[1]).to_string() }} else {{ "could not write".to_string() }}')


def _reader(path: Path) -> str:
    """Prints what it read of `path` (or why it could not)."""
    return _rust(f'std::fs::read_to_string("{path}").unwrap_or_else(|e| e.to_string()).trim().to_string()')


def _includer(path: Path) -> str:
    return f'fn main() {{\n    println!("{{}}", include_str!("{path}").trim());\n}}\n'


def _connector(port: int) -> str:
    """The right product, after sending its stdin to 127.0.0.1:port if it can."""
    return _rust("{ use std::io::Write; "
                 f'if let Ok(mut c) = std::net::TcpStream::connect("127.0.0.1:{port}") '
                 "{ let _ = c.write_all(s.as_bytes()); } v[0] * v[1] }")


@pytest.fixture
def secret() -> Iterator[tuple[Path, dict[str, Any]]]:
    """A problem with one test whose expected output sits in a root-only file in a root-only folder."""
    problem = copy.deepcopy(TEST["product"])
    problem["private_tests"] = problem["generated_tests"] = {"input": [], "output": []}
    problem["time_limit_s"] = 1.0
    folder = Path(tempfile.mkdtemp(prefix="rcc-scorer-secret-"))  # 0700, root's
    path = folder / "answer.txt"
    path.write_text(problem["public_tests"]["output"][0] + "\n")
    path.chmod(0o600)
    yield path, problem
    shutil.rmtree(folder, ignore_errors=True)


@needs_root
def test_the_secret_programs_would_read_the_answer_without_the_uid_drop(
        secret: tuple[Path, dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    """The reading programs below are right: as the scorer's own uid they solve the problem."""
    monkeypatch.delenv("OPENREBENCH_SOLUTION_UID", raising=False)
    path, problem = secret
    assert _judge([_reader(path), _includer(path)], [problem, problem]) == ["solved", "solved"]


@needs_root
@pytest.mark.timing  # the fork bomb races the kill of what it forked on a loaded machine
@pytest.mark.usefixtures("dropping")
def test_hostile_programs_are_contained_and_the_judge_still_works(
        secret: tuple[Path, dict[str, Any]]) -> None:
    secret_path, secret_problem = secret
    product = copy.deepcopy(TEST["product"])
    product["time_limit_s"] = 1.0  # the wall-clock limit of each run
    closed = open_dir(0o755)  # root's, open to read: 65534 may not create a file in it
    shared = open_dir(0o1777)  # like /tmp: 65534 may create files there
    received: list[bytes] = []
    before = _program_pids()

    async def judge_with_a_listener() -> tuple[list[str], float]:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            received.append(await reader.read())
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        cases = [(CORRECT["product"], product), (LOOP, product), (ALLOC, product), (FORKS, product),
                 (_writer(closed / "written.txt", shared / "written.txt"), product),
                 (_reader(secret_path), secret_problem), (_includer(secret_path), secret_problem),
                 (_connector(port), product)]
        t0 = time.monotonic()
        try:
            outcomes = await scorer.judge_all([{"status": "answered", "source": s} for s, _ in cases],
                                              [p for _, p in cases], PARAMS)
        finally:
            server.close()
            await server.wait_closed()
        return outcomes, time.monotonic() - t0

    try:
        outcomes, seconds = asyncio.run(judge_with_a_listener())
        correct, loop, alloc, forks, write, read, include, connect = outcomes
        assert correct == "solved", outcomes  # the hostile ones broke nothing of the judge
        assert loop == "timeout"
        assert alloc in ("memory", "runtime_error")
        assert forks in ("timeout", "runtime_error")
        assert write != "solved"
        assert not (closed / "written.txt").exists()
        # RLIMIT_FSIZE=0 stops every byte written, not the creation of an empty file where 65534 may
        # create one (/tmp here; the scoring sandbox's /tmp is its own tmpfs)
        assert not (shared / "written.txt").exists() or (shared / "written.txt").stat().st_size == 0
        assert read != "solved"  # it printed what it could read: nothing of the answer
        assert include == "compile_error"
        assert connect == "solved"
        # In this process there is no network namespace, so 127.0.0.1 is reachable from a program (the
        # scorer's sandbox in the full pipeline has no network): all it can send is its own stdin, the
        # test inputs, never an expected output (those are in no file or process it can reach).
        inputs = {i.encode() for group in problems.TEST_GROUPS for i in product[group]["input"]}
        assert all(payload in inputs for payload in received), received
        # each run was cut off at its wall-clock limit (1 s), so the whole call took a few compiles' time
        assert seconds < 60
        deadline = time.monotonic() + 5
        while (left := _program_pids() - before) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not left, f"processes of the judged programs outlived them: {sorted(left)}"
    finally:
        shutil.rmtree(closed, ignore_errors=True)
        shutil.rmtree(shared, ignore_errors=True)


# ---------------------------------------------- 4. the held-out file is out of the scaffold's reach

READS_HELD_OUT = textwrap.dedent("""
    HELD_OUT = @HELD_OUT@
    PRODUCT = @PRODUCT@
    SQUARE_READER = @SQUARE_READER@


    async def generate_solution(client, semaphore, problem):
        if problem["name"].startswith("mini-square-"):
            return SQUARE_READER
        try:
            with open(HELD_OUT) as f:
                f.read()
        except PermissionError:
            return PRODUCT
        except Exception as e:
            return "fn main() { println!(\\"%s\\"); }" % type(e).__name__
        return "fn main() { println!(\\"read the held-out file\\"); }"
""")


def _square_reader(path: Path) -> str:
    """The right square only when reading `path` is refused."""
    return _rust(f'match std::fs::read_to_string("{path}") {{ '
                 "Err(ref e) if e.kind() == std::io::ErrorKind::PermissionDenied => "
                 "(v[0] * v[0]).to_string(), "
                 'Err(e) => format!("unexpected: {}", e), Ok(_) => "read the held-out file".to_string() }')


@needs_root
@pytest.mark.usefixtures("dropping")
def test_neither_scaffold_nor_program_can_read_the_held_out_file() -> None:
    """Each answer is right only if reading test.jsonl failed with a permission error: solved proves it."""
    protected = Path(tempfile.mkdtemp(prefix="rcc-scorer-protected-"))
    solution = open_dir()
    try:
        protected.chmod(0o700)
        held_out = protected / scorer.TEST_FILE
        _protected(protected, [TEST["product"], TEST["square"]])
        code = (READS_HELD_OUT.replace("@HELD_OUT@", repr(str(held_out)))
                .replace("@PRODUCT@", repr(CORRECT["product"]))
                .replace("@SQUARE_READER@", repr(_square_reader(held_out))))
        _solution(solution, code)
        result = scorer.score(SPEC, solution, protected)
        assert result.details.get("by_problem") == {TEST["product"]["name"]: "solved",
                                                    TEST["square"]["name"]: "solved"}, result.message
        assert result.raw == 1.0
    finally:
        shutil.rmtree(protected, ignore_errors=True)
        shutil.rmtree(solution, ignore_errors=True)


# ---------------------------------------------------------------------------- 5. no rustc

def test_no_rustc_is_an_infrastructure_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not the agent's fault, said so, and its scaffold is not even run."""
    _model_env(monkeypatch)
    monkeypatch.setattr(rust_utils, "find_rustc", lambda: None)
    imported = tmp_path / "imported"
    solution = _solution(tmp_path / "solution", f"open({str(imported)!r}, 'w').close()\n"
                                                "async def generate_solution(client, semaphore, problem):\n"
                                                f"    return {CORRECT['product']!r}\n")
    protected = _protected(tmp_path / "protected", [TEST["product"]])
    result = scorer.score(SPEC, solution, protected)
    assert result.raw is None
    assert result.message.startswith("Invalid: ")
    assert "infrastructure" in result.message
    assert result.details.get("infrastructure") is True
    assert not imported.exists()


# ------------------------------------------------------------------------ odd answers, the whole pipeline

def test_an_answer_that_is_not_valid_unicode_is_judged_not_a_crash(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _model_env(monkeypatch)
    monkeypatch.delenv("OPENREBENCH_SOLUTION_UID", raising=False)
    source = CORRECT["product"] + "// \ud800\n"
    solution = _solution(tmp_path / "solution", "async def generate_solution(client, semaphore, problem):\n"
                                                f"    return {source!r}\n")
    protected = _protected(tmp_path / "protected", [TEST["product"]])
    result = scorer.score(SPEC, solution, protected)
    assert result.raw is not None, result.message
    assert result.details["by_problem"][TEST["product"]["name"]] in ("solved", "compile_error")


LINGERS = textwrap.dedent("""
    import subprocess
    from pathlib import Path

    import rust_codecontests_utils as rcu

    PROGRAMS = @PROGRAMS@
    PLAIN = @PLAIN@


    async def generate_solution(client, semaphore, problem):
        family = problem["name"].split("-")[1]
        if family == "product":
            # a process of its own session, out of the host's process group, and the toolchain the
            # agent's evaluate.py uses, as the scorer's uid sees it in the sandbox
            subprocess.Popen(["python3", "-c", "import time; time.sleep(300)", "rcc-lingering-scaffold"],
                             start_new_session=True)
            result = await rcu.evaluate_problem(PLAIN, problem, workdir=Path("/tmp/rcc-stub"),
                                                include_hidden=False)
            if not result.solved:
                return "rustc in the sandbox: " + result.summary()
            try:
                open("/score/protected/test.jsonl").read()
                return "read the held-out file"
            except PermissionError:
                pass
        return PROGRAMS[family]
""")

# Each prints the right answer only when it finds what it looks for in /proc: `square` the scorer
# itself (so the scan sees the other processes of the sandbox), `product` no process of the scaffold.
SCAN = ("use std::io::Read;\n"
        "fn seen(marker: &str) -> bool {\n"
        "    std::fs::read_dir(\"/proc\").unwrap().filter_map(|e| e.ok()).any(|e| {\n"
        "        std::fs::read(e.path().join(\"cmdline\"))\n"
        "            .map(|c| String::from_utf8_lossy(&c).contains(marker)).unwrap_or(false)\n"
        "    })\n"
        "}\n"
        "fn main() {\n"
        "    let mut s = String::new();\n"
        "    std::io::stdin().read_to_string(&mut s).unwrap();\n"
        "    let v: Vec<i64> = s.split_whitespace().map(|w| w.parse().unwrap()).collect();\n"
        "    let ok = WANT;\n"
        "    println!(\"{}\", if ok { SQUARE } else { -1 });\n"
        "}\n")


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or bwrap_usable() is not None, reason="needs root and bubblewrap")
def test_in_the_scoring_sandbox_nothing_of_the_scaffold_outlives_its_phase(tmp_path: Path) -> None:
    """The real pipeline (a run, the sandboxed scorer, the gateway's grant): the scaffold, as the sandbox's
    uid, compiles with the bound toolchain and cannot read the held-out file; a process it left in a
    session of its own is gone before the programs are judged, which the programs check in /proc."""
    from openrebench.harness import RunModels
    from openrebench.runs import get_environment, score_run, start_run
    from openrebench.runs._scoring import _record_protected

    env = get_environment("rust_codecontests")
    run, _ = start_run(env, "mini", tmp_path / "run", score_start=False,
                       access=RunModels.for_tier(env, "mini").scoring)
    records = [TEST["square"], TEST["product"]]
    (run.protected / "test.jsonl").unlink()
    problems.write_jsonl(run.protected / "test.jsonl", records)
    _record_protected(run)  # two problems of the 24: the set-up's record of the protected files follows
    programs = {"square": SCAN.replace("WANT", 'seen("_scorer_main")').replace("SQUARE", "v[0] * v[0]"),
                "product": SCAN.replace("WANT", '!seen("rcc-lingering-scaffold")')
                               .replace("SQUARE", "v[0] * v[1]")}
    (run.workspace / MODULE).write_text(LINGERS.replace("@PROGRAMS@", repr(programs))
                                        .replace("@PLAIN@", repr(CORRECT["product"])))
    row = score_run(run, timeout_s=300, access=RunModels.of_run(run).scoring)
    assert row.details.get("sandboxed") is True, row.message
    want = {TEST["square"]["name"]: "solved", TEST["product"]["name"]: "solved"}
    assert row.details["by_problem"] == want, (row.message, row.details.get("by_problem"))


SPENDS = textwrap.dedent("""
    import asyncio

    import openai

    PROGRAM = @PROGRAM@
    spent = asyncio.Event()


    async def generate_solution(client, semaphore, problem):
        ask = dict(model="task_model", messages=[{"role": "user", "content": problem["description"]}],
                   max_tokens=5)
        if problem["name"].split("-")[1] == "square":  # after product's scaffold found the budget spent
            await spent.wait()
            await client.chat.completions.create(**ask)  # raises: a 429, counted as this answer's failure
            return "unreachable"
        for _ in range(5):
            try:
                await client.chat.completions.create(**ask)
            except openai.RateLimitError as e:
                spent.set()
                return PROGRAM if "budget" in str(e) else "a 429 that does not name the budget"
        return "the budget was never spent"
""")


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or bwrap_usable() is not None, reason="needs root and bubblewrap")
def test_a_scaffold_that_spends_the_scorings_budget_gets_429s_and_the_scoring_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from openrebench.api import ModelBudget
    from openrebench.gateway._server import prompt_bound
    from openrebench.harness import RunModels
    from openrebench.runs import get_environment, score_run, start_run
    from openrebench.runs._scoring import _record_protected

    env = get_environment("rust_codecontests")
    spec = type(env).tiers["mini"]
    # Room for product's first request alone (the gateway holds its prompt's bound and 5 tokens); mockllm
    # writes 33 whatever max_tokens says, which leaves too little for any other.
    first = prompt_bound("chat", {"model": "task_model", "max_tokens": 5,
                                  "messages": [{"role": "user", "content": TEST["product"]["description"]}]})
    monkeypatch.setitem(type(env).tiers, "mini", spec.model_copy(
        update={"scoring_model_budget": ModelBudget(tokens=first + 5)}))
    models = RunModels.for_tier(env, "mini", {"task_model": "mockllm/model"})
    assert models is not None
    run, _ = start_run(env, "mini", tmp_path / "run", score_start=False, access=models.scoring)
    (run.protected / "test.jsonl").unlink()
    problems.write_jsonl(run.protected / "test.jsonl", [TEST["product"], TEST["square"]])
    _record_protected(run)
    (run.workspace / MODULE).write_text(SPENDS.replace("@PROGRAM@", repr(CORRECT["product"])))
    row = score_run(run, timeout_s=300, access=models.scoring)
    assert row.raw == 0.5, row.message
    assert row.details["by_problem"] == {TEST["product"]["name"]: "solved", TEST["square"]["name"]: "raised"}
    used = row.details["models"]
    assert used["total"]["requests"] >= 2 and used["roles"]["task_model"]["prompt_tokens"] > 0
