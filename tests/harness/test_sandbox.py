"""Isolation of the agent's sandbox: what a hostile agent tries from inside it fails or is contained."""

from __future__ import annotations

import asyncio
import os
import textwrap
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from openrebench.harness import OpenRebenchSandbox, SandboxConfig
from openrebench.isolation import bwrap_binary
from openrebench.runs import Run, start_run

pytestmark = pytest.mark.skipif(bwrap_binary() is None, reason="bubblewrap is not available")
pytest_plugins = ["lm_support"]


def make_run(path: Path) -> Run:
    return start_run("optimize_kernel", "mini", path, score_start=False)[0]


@pytest.fixture
def box(tmp_path: Path) -> Iterator[OpenRebenchSandbox]:
    loop = asyncio.new_event_loop()
    run = make_run(tmp_path / "run")
    (run.protected / "heldout.bin").write_text("secret held-out data")
    config = SandboxConfig(env_id="optimize_kernel", tier="mini", memory_limit_gb=2)
    sandbox = loop.run_until_complete(OpenRebenchSandbox.for_run(run, config))
    sandbox.loop = loop  # type: ignore[attr-defined]
    yield sandbox
    loop.run_until_complete(sandbox.close())
    loop.close()


def sh(box: OpenRebenchSandbox, script: str, timeout: int = 60):
    return box.loop.run_until_complete(box.exec(["bash", "-c", script], timeout=timeout))  # type: ignore[attr-defined]


def test_workspace_is_writable_and_python_with_torch_works(box: OpenRebenchSandbox) -> None:
    result = sh(box, "pwd; echo hi > note.txt; python -c 'import torch; print(torch.__version__)'")
    assert result.success, result.stderr
    assert result.stdout.splitlines()[0] == "/workspace"
    assert (box.run.workspace / "note.txt").read_text() == "hi\n"


def test_protected_data_score_log_and_run_files_are_unreachable(box: OpenRebenchSandbox) -> None:
    run = box.run
    result = sh(box, f"cat {run.protected}/heldout.bin; ls {run.path}; echo x >> {run.score_log_path}; "
                     f"ls /run/openrebench; cat /workspace/../protected/heldout.bin")
    assert "secret" not in result.stdout
    assert "score.sock" in result.stdout  # the one thing of the harness the agent sees
    assert run.score_log_path.read_text() == ""
    assert "run.json" not in result.stdout


def test_reference_solution_of_the_package_is_hidden(box: OpenRebenchSandbox) -> None:
    import openrebench

    ref = Path(openrebench.__file__).parent / "environments" / "optimize_kernel" / "reference"
    result = sh(box, f"ls -A {ref} 2>&1; cat {ref}/solution.py 2>&1 | head -3")
    assert "def prefix_sum" not in result.stdout


def test_no_network(box: OpenRebenchSandbox) -> None:
    code = "import socket\ntry:\n    socket.create_connection(('127.0.0.1', 22), timeout=3)\n" \
           "    print('CONNECTED')\nexcept OSError as e:\n    print('blocked', e)\n"
    result = sh(box, f"python -c \"{code}\"; ip link 2>/dev/null | grep -c UP || true")
    assert "CONNECTED" not in result.stdout and "blocked" in result.stdout


def test_other_runs_and_root_only_files_are_unreadable(box: OpenRebenchSandbox, tmp_path: Path) -> None:
    other = make_run(tmp_path / "other")
    (other.workspace / "solution.py").write_text("# another agent's work")
    secret = tmp_path / "root-only.txt"
    secret.write_text("root secret")
    secret.chmod(0o600)
    result = sh(box, f"cat {other.workspace}/solution.py; cat {secret}; ls -A /root /home; id -u")
    assert "another agent" not in result.stdout and "root secret" not in result.stdout
    shadow = sh(box, "cat /etc/shadow")
    assert not shadow.success and shadow.stdout == ""
    if os.geteuid() == 0:  # a uid of the attempt's own, not root and not the shared nobody
        uid = int(result.stdout.strip().splitlines()[-1])
        assert uid == box.backend.uid and uid not in (0, 65534)


def test_fork_bomb_is_contained(box: OpenRebenchSandbox) -> None:
    with pytest.raises(TimeoutError):
        sh(box, "bomb() { bomb | bomb & }; bomb; sleep 60", timeout=5)
    # Everything the bomb started went with the sandbox's PID namespace.
    left = [p for p in psutil.process_iter(["uids", "name", "status"])
            if p.info["uids"] and p.info["uids"].real == box.backend.uid and p.info["name"] == "bash"
            and p.info["status"] != psutil.STATUS_ZOMBIE]
    assert left == []
    assert sh(box, "echo alive").stdout.strip() == "alive"


def test_filling_memory_is_contained(box: OpenRebenchSandbox) -> None:
    script = textwrap.dedent("""
        try:
            blocks = [bytearray(256 * 1024 * 1024) for _ in range(40)]
            print('ALLOCATED 10 GB')
        except MemoryError:
            print('MemoryError')
    """)
    result = sh(box, f"python -c \"{script}\"")
    assert "ALLOCATED" not in result.stdout and "MemoryError" in result.stdout


def test_score_command_in_the_sandbox_asks_the_harness(box: OpenRebenchSandbox) -> None:
    (box.run.workspace / "solution.py").write_text("def prefix_sum(x):\n    return x\n")
    result = sh(box, "score", timeout=300)
    assert "Invalid: wrong output" in result.stdout, result.stdout + result.stderr
    rows, _ = box.run.rows()
    assert len(rows) == 1 and rows[0].raw is None and rows[0].charged
    assert "#0" in sh(box, "score log").stdout


def test_tmp_and_home_persist_between_commands(box: OpenRebenchSandbox) -> None:
    # A name of its own: the checkout under test may itself live in /tmp (bound into the sandbox).
    script = "echo kept > /tmp/kept-between-calls && echo mine > ~/notes && whoami"
    assert sh(box, script).stdout.strip() in ("agent", "root")
    result = sh(box, "cat /tmp/kept-between-calls ~/notes")
    assert result.stdout.split() == ["kept", "mine"]
    assert box.loop.run_until_complete(box.read_file("/tmp/kept-between-calls")) == "kept\n"  # type: ignore[attr-defined]


def test_scoring_sandbox_hides_protected_data_reference_and_log(box: OpenRebenchSandbox) -> None:
    """The solution's code, run by the scorer, sees no more than the agent's shell does."""
    import openrebench
    from openrebench.runs import score_run

    run = box.run
    ref = Path(openrebench.__file__).parent / "environments" / "optimize_kernel" / "reference"
    probe = textwrap.dedent(f"""
        import glob
        seen = []
        for pattern in ["/score/protected/*", "{run.protected}/*", "{ref}/*", "{run.score_log_path}"]:
            for path in glob.glob(pattern):
                try:
                    seen.append(open(path).read()[:40])
                except OSError as e:
                    seen.append(type(e).__name__)
        try:
            open("{run.score_log_path}", "a").write("forged row")
        except OSError as e:
            seen.append("log: " + type(e).__name__)
        raise SystemExit("SEEN " + repr(seen))
    """)
    (run.workspace / "solution.py").write_text(probe)
    row = score_run(run, sandboxed=True, timeout_s=60)
    assert row.raw is None and "SEEN" in row.message, row.message
    assert "secret" not in row.message and "prefix_sum" not in row.message
    assert "forged" not in run.score_log_path.read_text()
    assert row.details["sandboxed"] is True


def test_processes_together_cannot_exceed_the_sandbox_memory(box: OpenRebenchSandbox) -> None:
    """Each process stays under the per-process limit; the cgroup limits their sum (2 GB here)."""
    if box.cgroup is None:
        pytest.skip("no cgroup could be made here (only per-process limits apply)")
    hold = ("python -c \"b = bytearray(700 << 20); b[::4096] = b'x' * len(b[::4096]); "
            "import time; time.sleep(4); print('HELD')\" &")
    result = sh(box, f"for i in 1 2 3 4 5; do {hold} done; wait", timeout=120)
    assert result.stdout.count("HELD") < 5
    assert sh(box, "echo alive").stdout.strip() == "alive"


def test_login_shell_for_people_has_the_score_command(box: OpenRebenchSandbox) -> None:
    async def login() -> tuple[bytes, bytes]:
        connection = await box.connection()
        proc = await asyncio.create_subprocess_exec(connection.command, stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE)
        return await asyncio.wait_for(proc.communicate(b"pwd; score log; whoami\n"), 60)

    out, err = box.loop.run_until_complete(login())  # type: ignore[attr-defined]
    assert "/workspace" in out.decode() and "no scores yet" in out.decode(), err.decode()


def test_auto_isolation_refuses_where_no_sandbox_starts(monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path) -> None:
    """`auto` never falls back to no isolation: it names what is missing; `none` runs only by name, loudly."""
    from openrebench.harness import backends
    from openrebench.harness.backends import bwrap

    monkeypatch.setattr(bwrap, "bwrap_usable", lambda: "user namespaces are disabled")
    with pytest.raises(RuntimeError, match=r"no isolating sandbox can start here \(bwrap: user "
                                           r"namespaces are disabled\).*--isolation none"):
        backends.resolve_isolation("auto")
    assert "user namespaces are disabled" in (backends.isolation_problem("auto") or "")
    with pytest.raises(RuntimeError, match="user namespaces are disabled"):
        backends.resolve_isolation("bwrap")
    backend, _ = backends.resolve_isolation("none")
    with pytest.warns(UserWarning, match="NOTHING IS ISOLATED"):
        backends.warn_unisolated(backend, None)
    run = make_run(tmp_path / "none")
    loop = asyncio.new_event_loop()
    with pytest.raises(RuntimeError, match="no isolating sandbox"):
        loop.run_until_complete(OpenRebenchSandbox.for_run(run, SandboxConfig(env_id="optimize_kernel")))
    unisolated = loop.run_until_complete(OpenRebenchSandbox.for_run(
        run, SandboxConfig(env_id="optimize_kernel", isolation="none")))
    try:
        assert unisolated.isolation == "none"
        result = loop.run_until_complete(unisolated.exec(["bash", "-c", "pwd"]))
        assert result.stdout.strip() == str(run.workspace)
    finally:
        loop.run_until_complete(unisolated.close())
        loop.close()


def test_cpu_time_of_an_attempt_is_limited(tmp_path: Path) -> None:
    """Two busy processes in a sandbox limited to half a core get about half a core between them."""
    import time

    loop = asyncio.new_event_loop()
    sandbox = loop.run_until_complete(OpenRebenchSandbox.for_run(
        make_run(tmp_path / "run"), SandboxConfig(env_id="optimize_kernel", cpus=0.5)))
    try:
        if sandbox.cgroup is None or not sandbox.cgroup.cpu_limited:
            pytest.skip("no CPU controller in the cgroup this harness may make")
        burn = "python -c \"import time,os; t=time.time(); exec('while time.time()-t<3: pass'); " \
               "print(os.times().user)\" &"
        started = time.monotonic()
        result = loop.run_until_complete(sandbox.exec(["bash", "-c", f"{burn} {burn} wait"], timeout=60))
        wall = time.monotonic() - started
        cpu = sum(float(x) for x in result.stdout.split())
        assert cpu / wall < 0.8, (cpu, wall)  # unlimited it would be up to 2.0 on two free cores
    finally:
        loop.run_until_complete(sandbox.close())
        loop.close()


@pytest.mark.parametrize("env_id", ["optimize_kernel", "scaling_law"])
def test_agent_processes_are_frozen_while_any_scoring_runs(
        env_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lm_home: Path) -> None:
    """A counter the agent leaves running makes no progress while the run is scored (a timed environment
    or not: the solution's code sees held-out data), and goes on after (the scoring itself is replaced by
    one that watches the counter). scaling_law's data comes from the session's shared cache (its corpus
    and tokenizer, as the other tests build them), not built again."""
    monkeypatch.setenv("OPENREBENCH_HOME", str(lm_home))
    loop = asyncio.new_event_loop()
    run = start_run(env_id, "mini", tmp_path / "run", score_start=False)[0]
    box = loop.run_until_complete(OpenRebenchSandbox.for_run(run, SandboxConfig(env_id=env_id)))
    box.loop = loop  # type: ignore[attr-defined]
    try:
        _frozen_while_scored(box, monkeypatch)
    finally:
        loop.run_until_complete(box.close())
        loop.close()


def _frozen_while_scored(box: OpenRebenchSandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from openrebench.harness import _sandbox

    if box.cgroup is None or not box.cgroup.can_freeze:
        pytest.skip("no freezer in the cgroup this harness may make")
    counter = box.harness_dir / "state" / "tmp" / "count"
    seen: list[tuple[str, str]] = []

    def watching_score_run(run: Run, **kwargs: object) -> str:
        first = counter.read_text()
        time.sleep(1.0)
        seen.append((first, counter.read_text()))
        return "row"

    monkeypatch.setattr(_sandbox, "score_run", watching_score_run)
    count = ("for i in $(seq 200); do echo $i > /tmp/count.new && mv /tmp/count.new /tmp/count; sleep 0.02; "
             "done")

    async def scenario() -> tuple[object, int, int]:
        job = asyncio.create_task(box.exec(["bash", "-c", count], timeout=60))
        while not counter.exists():
            await asyncio.sleep(0.05)
        row = await box.score()
        thawed = int(counter.read_text())
        await asyncio.sleep(0.5)
        later = int(counter.read_text())
        assert (await job).success
        return row, thawed, later

    row, thawed, later = box.loop.run_until_complete(scenario())  # type: ignore[attr-defined]
    assert row == "row" and seen[0][0] == seen[0][1]  # frozen for the whole scoring
    assert later > thawed  # and running again after it


def test_calibration_records_of_the_package_are_hidden(box: OpenRebenchSandbox) -> None:
    """The records hold the reference's results (and, for scaling_law, values that give the optimum away)."""
    import openrebench

    envs = Path(openrebench.__file__).parent / "environments"
    assert list(envs.glob("*/calibration/*.json"))
    code = (f"import glob; print(len(glob.glob('{envs}/*/calibration/*')), "
            f"len(glob.glob('{envs}/*/reference/*')))")
    result = sh(box, f'python -c "{code}"')
    assert result.stdout.split() == ["0", "0"], result.stdout + result.stderr
