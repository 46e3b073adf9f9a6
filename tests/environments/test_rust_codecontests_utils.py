"""rust_codecontests' Rust utilities, with the real rustc: extraction, judging, and the limits and uid drop
that keep an untrusted program from the scorer's files and secrets.

The package is loaded by file path under the name the agent's workspace gives it, standing alone:
that is how evaluate.py imports it, and it proves it needs nothing of openrebench.
"""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import rust_support
from rust_support import SETPRIV, needs_root, open_dir

SOURCE = (Path(__file__).parents[2] / "src" / "openrebench" / "environments" / "rust_codecontests"
          / "rust_utils" / "__init__.py")
# loaded by path under the agent's name, as the workspace's copy is: standard library only
_spec = importlib.util.spec_from_file_location("rust_codecontests_utils", SOURCE,
                                               submodule_search_locations=[str(SOURCE.parent)])
assert _spec is not None and _spec.loader is not None
rcu = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = rcu  # dataclasses look their module up by name
_spec.loader.exec_module(rcu)

pytestmark = pytest.mark.skipif(rcu.find_rustc() is None, reason="needs rustc")

MIB = 1 << 20

# One binary, many behaviours: the first word of stdin picks one (a compile costs ~0.6 s of two shared cores).
TOOL = r"""
use std::io::{self, Read, Write};
extern "C" { fn fork() -> i32; fn setsid() -> i32; fn sleep(s: u32) -> u32; }
fn main() {
    let mut s = String::new();
    io::stdin().read_to_string(&mut s).unwrap();
    let mut words = s.split_whitespace();
    match words.next().unwrap_or("") {
        "sum" => println!("{}", words.map(|w| w.parse::<i64>().unwrap()).sum::<i64>()),
        "loop" => { let mut x: u64 = 0; loop { x = std::hint::black_box(x.wrapping_add(1)); } }
        "alloc" => { let v = vec![1u8; 2 << 30]; println!("{}", v[v.len() / 2]); }
        "spam" => {
            let out = io::stdout();
            let mut o = io::BufWriter::new(out.lock());
            loop { o.write_all(b"spam spam spam spam\n").unwrap(); }
        }
        "write" => { std::fs::write(words.next().unwrap(), "hello").unwrap(); println!("wrote"); }
        "read" => match std::fs::read_to_string(words.next().unwrap()) {
            Ok(t) => println!("READ {}", t.trim()),
            Err(e) => println!("DENIED {}", e),
        },
        "panic" => panic!("boom"),
        "escape" => unsafe {  // a child leaves the process group, keeping stdout; the parent finishes
            let pid = fork();
            if pid == 0 { setsid(); sleep(30); std::process::exit(0); }
            std::thread::sleep(std::time::Duration::from_millis(100));
            eprintln!("{}", pid);
            println!("hi");
        },
        _ => println!("unknown"),
    }
}
"""

SUM = """
use std::io::Read;
fn main() {
    let mut s = String::new();
    std::io::stdin().read_to_string(&mut s).unwrap();
    let t: i64 = s.split_whitespace().map(|w| w.parse::<i64>().unwrap()).sum();
    println!("{}", t);
}
"""


def _root_only_file(folder: Path, text: str) -> Path:
    """A file the unprivileged uid can reach (its folder is open) but not read."""
    path = folder / "secret.txt"
    path.write_text(text)
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def tool() -> Iterator[Path]:
    """The behaviour-picking binary, compiled once as the caller, in a folder 65534 may enter."""
    folder = open_dir()
    result = asyncio.run(rcu.compile_rust(TOOL, folder))
    assert result.ok, result.error
    yield result.binary
    shutil.rmtree(folder, ignore_errors=True)


def _run(binary: Path, stdin: str, expected: str = "", **kw: object) -> rcu.TestOutcome:
    kw = {"timeout_s": 5.0, "memory_bytes": 256 * MIB, **kw}
    return asyncio.run(rcu.run_test(binary, stdin, expected, **kw))


# ----------------------------------------------------------------------------------- pure functions


def test_the_package_imports_only_the_standard_library_and_itself() -> None:
    own = {p.stem for p in SOURCE.parent.glob("*.py")}
    for path in SOURCE.parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module.split(".")[0] for n in ast.walk(tree)
                  if isinstance(n, ast.ImportFrom) and n.module and n.level == 0}
        assert names - {"__future__"} <= set(sys.stdlib_module_names), path.name
        relative = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level}
        assert relative <= own and all(n.level == 1 for n in ast.walk(tree)
                                       if isinstance(n, ast.ImportFrom) and n.level), path.name


@pytest.mark.parametrize(("reply", "program"), [
    ("Here:\n```rust\nfn main() {}\n```\nDone.", "fn main() {}\n"),
    ("```rs\nfn main() { a(); }\n```", "fn main() { a(); }\n"),
    ("```\nfn main() { b(); }\n```", "fn main() { b(); }\n"),
    ("A sketch:\n```rust\nfn helper() {}\n```\nFull:\n```rust\nfn main() { c(); }\n```\nTest:\n```rust\n"
     "assert!(x);\n```", "fn main() { c(); }\n"),  # the block with fn main, though not the last
    ("```rust\nfn main() { one(); }\n```\n```rust\nfn main() { two(); }\n```", "fn main() { two(); }\n"),
    ("```text\n3\n```\n```rust\nfn f() {}\n```\n```text\n4\n```", "fn f() {}\n"),  # rust before other tags
    ("```python\nprint(1)\n```", "print(1)\n"),
    ("cut off:\n```rust\nfn main() {\n    let x = 1;", "fn main() {\n    let x = 1;\n"),  # unterminated
    ("1. Code:\n   ```rust\n   fn main() {}\n   ```", "fn main() {}\n"),  # indented fence
    ("~~~rust\nfn main() {}\n~~~", "fn main() {}\n"),
    ("````rust\nlet s = \"```\";\nfn main() {}\n````", "let s = \"```\";\nfn main() {}\n"),
    ("fn main() { bare(); }", "fn main() { bare(); }\n"),
    ("   \n", ""),
    ("```rust\n```", ""),  # an empty block is not a reason to compile the prose around it
])
def test_extract_rust_takes_the_program_out_of_a_reply(reply: str, program: str) -> None:
    assert rcu.extract_rust(reply) == program


@pytest.mark.parametrize(("actual", "expected", "same"), [
    ("3\n", "3", True),
    ("  3  \n\n", "3", True),
    ("1 2\r\n3\r\n", "1 2\n3\n", True),
    ("1 2   \n3\t\n", "1 2\n3", True),  # trailing spaces on a line
    ("\n\nYES\n", "YES", True),
    ("1  2\n", "1 2\n", False),  # inner spacing counts
    ("1\n\n2\n", "1\n2\n", False),  # inner blank lines count
    ("3", "4", False),
    ("", "", True),
    ("yes", "YES", False),
])
def test_outputs_match_trims_ends_and_trailing_spaces_only(actual: str, expected: str, same: bool) -> None:
    assert rcu.outputs_match(actual, expected) is same


def test_find_rustc_resolves_a_rustup_proxy_to_the_real_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    on_path = shutil.which("rustc")
    assert on_path is not None
    monkeypatch.setenv("RUSTC", on_path)
    found = rcu.find_rustc()
    assert found is not None and Path(found).name == "rustc"
    assert not Path(found).resolve().name.startswith("rustup")
    monkeypatch.setenv("RUSTC", "/nonexistent/rustc")  # not executable: PATH's is used
    assert rcu.find_rustc() == found


def test_a_program_without_main_fails_without_running_rustc(tmp_path: Path) -> None:
    problem = {"public_tests": {"input": ["1"], "output": ["1"]},
               "private_tests": {"input": ["2"], "output": ["2"]},
               "generated_tests": {"input": ["3", "4"], "output": ["3", "4"]}, "time_limit_s": 1,
               "memory_limit_bytes": 64 * MIB}
    kw = {"workdir": tmp_path, "rustc": "/nonexistent/rustc"}  # would be "could not start rustc" if run
    hidden = asyncio.run(rcu.evaluate_problem("I cannot solve this.", problem, **kw))
    public = asyncio.run(rcu.evaluate_problem("", problem, include_hidden=False, **kw))
    assert (hidden.compiled, hidden.solved, hidden.total) == (False, False, 4)
    assert hidden.failure == "compile_error"
    assert public.total == 1 and "fn main" in public.compile_error
    assert hidden.summary().startswith("compile error: error: the program has no `fn main()`")


# ----------------------------------------------------------------------------------------- judging


def test_programs_judged_at_once_are_solved_or_wrong_each_in_its_own_workdir(tmp_path: Path) -> None:
    tests = [("1 2", "3"), ("10 -4\n", "6\n"), ("5 5", "10")]
    wrong = [("1 2", "3"), ("1 1", "3"), ("5 5", "10")]
    kw = {"time_limit_s": 2.0, "memory_bytes": 256 * MIB}

    async def both() -> list[rcu.ProgramResult]:
        return list(await asyncio.gather(
            rcu.evaluate_program(SUM, tests, workdir=tmp_path / "a", **kw),
            rcu.evaluate_program(SUM, wrong, workdir=tmp_path / "b", **kw)))

    solved, failed = asyncio.run(both())
    assert (solved.compiled, solved.solved, solved.passed, solved.total) == (True, True, 3, 3)
    assert solved.failure is None
    assert solved.summary() == "solved (3/3 tests)"
    assert (failed.solved, failed.passed, failed.failure_test) == (False, 1, 2)
    assert failed.failure == failed.failure_status == "wrong_answer"
    assert len(failed.outcomes) == 2  # stopped at the first failure
    assert failed.summary() == "wrong answer on test 2 of 3"


def test_a_compile_error_is_reported_with_rustc_s_message(tmp_path: Path) -> None:
    source = 'fn main() {\n    let x: i32 = "three";\n    println!("{}", x);\n}\n'
    result = asyncio.run(rcu.evaluate_program(source, [("", "3")], workdir=tmp_path, time_limit_s=1,
                                              memory_bytes=64 * MIB))
    assert (result.compiled, result.solved, result.outcomes) == (False, False, [])
    assert result.failure == "compile_error"
    assert "mismatched types" in result.compile_error
    assert result.summary().startswith("compile error: error[E0308]: mismatched types")
    assert not (tmp_path / "main").exists()


def test_the_caller_s_secrets_reach_neither_rustc_nor_the_program(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "secret-x")
    source = ('fn main() {\n    println!("{}", option_env!("OPENAI_API_KEY").unwrap_or("unset"));\n'
              '    println!("{}", std::env::var("OPENAI_API_KEY").unwrap_or("unset".to_string()));\n}\n')
    result = asyncio.run(rcu.evaluate_program(source, [("", "unset\nunset")], workdir=tmp_path,
                                              time_limit_s=2, memory_bytes=64 * MIB))
    assert result.solved, result.outcomes


def test_a_correct_run_passes_and_a_panic_is_a_runtime_error(tool: Path) -> None:
    assert _run(tool, "sum 4 5", "9").status == "passed"
    panicked = _run(tool, "panic", "")
    assert panicked.status == "runtime_error" and panicked.returncode == 101 and "boom" in panicked.stderr


def test_an_endless_loop_times_out_on_the_wall_clock(tool: Path) -> None:
    t0 = time.monotonic()
    outcome = _run(tool, "loop", "", timeout_s=1.0)
    assert outcome.status == "timeout"
    assert time.monotonic() - t0 < 2.5


def test_allocating_past_the_memory_limit_fails(tool: Path) -> None:
    outcome = _run(tool, "alloc", "1", memory_bytes=256 * MIB)
    assert outcome.status in ("memory", "runtime_error")
    assert outcome.status == "memory", outcome.stderr  # Rust says "memory allocation of ... failed"


def test_unbounded_output_is_cut_off(tool: Path) -> None:
    t0 = time.monotonic()
    outcome = _run(tool, "spam", "", output_limit_bytes=MIB)
    assert outcome.status == "output_limit"
    assert time.monotonic() - t0 < 3


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie is dead (PID 1 of a container may never reap it)


@pytest.mark.timing  # a bound in seconds, and killing what forks races with a loaded machine
def test_what_a_program_forks_out_of_its_group_is_killed_with_it(tool: Path) -> None:
    t0 = time.monotonic()
    outcome = _run(tool, "escape", "hi")
    assert outcome.status == "passed" and time.monotonic() - t0 < 2
    escaped = int(outcome.stderr.split()[0])
    deadline = time.monotonic() + 2
    while _alive(escaped) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(escaped)


def test_a_program_cannot_write_files(tool: Path, tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    outcome = _run(tool, f"write {target}", "wrote", cwd=tmp_path)
    assert outcome.status == "runtime_error" and outcome.returncode == -signal.SIGXFSZ
    assert not target.exists() or target.stat().st_size == 0


# ------------------------------------------------------------------------------ the unprivileged uid



@pytest.fixture(scope="module")
def nobody_rustc() -> Iterator[str]:
    with rust_support.nobody_rustc() as rustc:
        yield rustc


@pytest.fixture
def nobody_workdir() -> Iterator[Path]:
    """A workdir made 65534's, as the scorer makes it."""
    d = open_dir()
    os.chown(d, 65534, 65534)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@needs_root
def test_a_program_run_as_nobody_cannot_read_a_root_only_file(tool: Path) -> None:
    folder = open_dir()
    try:
        secret = _root_only_file(folder, "top secret")
        assert _run(tool, f"read {secret}", "READ top secret").status == "passed"  # as root: it can
        assert _run(tool, f"read {secret}", "READ top secret", prefix=SETPRIV).status == "wrong_answer"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@needs_root
def test_compiling_and_running_as_nobody_solves_a_problem(nobody_rustc: str, nobody_workdir: Path) -> None:
    result = asyncio.run(rcu.evaluate_program(SUM, [("2 3", "5"), ("-1 1", "0")], workdir=nobody_workdir,
                                              time_limit_s=2, memory_bytes=256 * MIB, prefix=SETPRIV,
                                              rustc=nobody_rustc))
    assert result.solved, result.compile_error or result.outcomes
    assert (nobody_workdir / "main").stat().st_uid == 65534


@needs_root
def test_include_str_of_a_root_only_file_fails_to_compile_as_nobody(nobody_rustc: str,
                                                                     nobody_workdir: Path) -> None:
    folder = open_dir()
    try:
        secret = _root_only_file(folder, "top secret")
        source = f'fn main() {{ print!("{{}}", include_str!("{secret}")); }}\n'
        result = asyncio.run(rcu.evaluate_program(source, [("", "top secret")], workdir=nobody_workdir,
                                                  time_limit_s=2, memory_bytes=64 * MIB, prefix=SETPRIV,
                                                  rustc=nobody_rustc))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert not result.compiled
    assert "Permission denied" in result.compile_error
