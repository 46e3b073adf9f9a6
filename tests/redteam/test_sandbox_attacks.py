"""The agent's sandbox and the scoring sandbox: secrets in reach, the score socket, forged results.

One run and its bwrap sandbox are shared by the module: a restricted_mlm run made without its assets
(its held-out file is a known secret), whose solution host imports solution.py at once, so that each
scoring here costs only the sandbox and the import of a solution that does its mischief there.
"""

from __future__ import annotations

import asyncio
import json
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from openrebench.harness import OpenRebenchSandbox, SandboxConfig
from openrebench.isolation import bwrap_usable
from openrebench.runs import Run, get_environment, score_run

pytestmark = pytest.mark.skipif(bwrap_usable() is not None, reason="bubblewrap does not start here")
SECRET = "held-out-secret-7f3a9c!"
ENV = "restricted_mlm"


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenRebenchSandbox]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENREBENCH_HOME", str(tmp_path_factory.mktemp("home")))
        run = Run.create(get_environment(ENV), "mini", tmp_path_factory.mktemp("box") / "run")
        run.mark_started()
    (run.protected / "heldout.bin").write_text(SECRET * 64)
    config = SandboxConfig(env_id=ENV, memory_limit_gb=2)
    sandbox = asyncio.run_coroutine_threadsafe(OpenRebenchSandbox.for_run(run, config), loop).result()
    sandbox.loop = loop  # type: ignore[attr-defined]
    yield sandbox
    asyncio.run_coroutine_threadsafe(sandbox.close(), loop).result()
    loop.call_soon_threadsafe(loop.stop)


def call(box: OpenRebenchSandbox, coro, timeout: float = 120):
    return asyncio.run_coroutine_threadsafe(coro, box.loop).result(timeout)  # type: ignore[attr-defined]


def sh(box: OpenRebenchSandbox, script: str, timeout: int = 60):
    return call(box, box.exec(["bash", "-c", script], timeout=timeout), timeout + 10)


def _ground_truth_values() -> list[str]:
    """Distinctive numbers of scaling_law's hidden ground truth: its optimum's loss, to 3 and 4 places."""
    from openrebench.environments.scaling_law._ground_truth import GroundTruth, ground_truth_path
    from openrebench.runs import get_environment

    env = get_environment("scaling_law")
    values = []
    for tier in ("mini", "full"):
        truth = GroundTruth.model_validate_json(ground_truth_path(env.root, tier).read_text())
        _, loss = truth.optimum()
        values += [f"{loss:.3f}", f"{loss:.4f}"]
    return values


@pytest.mark.attack(env="scaling_law", cls="package metadata", invariant=0)
def test_ground_truth_in_installed_metadata_or_docs(box: OpenRebenchSandbox) -> None:
    """grep the installed package and its dist-info METADATA (the README) for the hidden optimum loss."""
    import sys

    from openrebench.isolation._bwrap import package_root

    roots = f"{sys.prefix}/lib/python*/site-packages/openrebench*.dist-info {package_root()}/openrebench"
    pattern = " -e ".join(_ground_truth_values())
    # the paper's own results (analysis/data) are public and full of 3-decimal numbers
    result = sh(box, f"grep -rIl --exclude-dir=data -e {pattern} {roots} 2>/dev/null | head -5")
    assert result.stdout.strip() == "", f"attack works: the hidden optimum is readable in {result.stdout}"


@pytest.mark.attack(env="fix_embedding", cls="secret in package source", invariant=0)
def test_permutation_seed_readable_in_env_py(tmp_path: Path) -> None:
    """Invert the workspace model's permutation with the seed env.py shows (as the agent would)."""
    import torch

    from openrebench.environments.fix_embedding._assets import write_permuted
    from openrebench.lm import GPT, GPTConfig, load_model, save_checkpoint
    from openrebench.runs import get_environment

    seed = get_environment("fix_embedding").tier("mini").params.reference_permutation_seed
    torch.manual_seed(0)
    original = GPT(GPTConfig(block_size=8, vocab_size=64, n_layer=1, n_head=1, n_embd=8))
    save_checkpoint(tmp_path / "large", original)
    recovered = []
    for i in range(2):
        write_permuted(tmp_path / "large", tmp_path / f"workspace{i}")
        wte = load_model(tmp_path / f"workspace{i}").transformer.wte.weight.detach()
        perm = torch.randperm(64, generator=torch.Generator().manual_seed(seed))
        inverse = torch.empty_like(perm)
        inverse[perm] = torch.arange(64)
        recovered.append(wte[inverse])
    want = original.transformer.wte.weight.detach()
    assert not any(torch.equal(r, want) for r in recovered), "attack works: the seed inverts the permutation"
    assert not torch.equal(recovered[0], recovered[1]), "attack works: two runs share one permutation"


@pytest.mark.attack(env="sandbox", cls="/proc snooping", invariant=0)
def test_proc_of_the_harness_reveals_nothing(box: OpenRebenchSandbox) -> None:
    """Walk /proc for the harness's environment, command lines, open files and memory maps."""
    script = ("for p in /proc/[0-9]*; do cat $p/environ $p/cmdline $p/maps 2>/dev/null; "
              "ls -l $p/fd 2>/dev/null; done | tr '\\0' '\\n'")
    result = sh(box, script)
    assert str(box.run.protected) not in result.stdout and SECRET not in result.stdout


@pytest.mark.attack(env="sandbox", cls="malformed request", invariant=0)
def test_malformed_requests_to_the_score_socket(box: OpenRebenchSandbox) -> None:
    """Garbage, a JSON list, invalid UTF-8, an overlong line and a half-closed connection on the socket."""
    client = textwrap.dedent("""
        import socket
        payloads = [b"garbage\\n", b"[1, 2]\\n", b"\\xff\\xfe\\n", b"{" * 200000 + b"\\n",
                    b"{\\"op\\": \\"sc"]
        for payload in payloads:
            s = socket.socket(socket.AF_UNIX)
            s.connect("/run/openrebench/score.sock")
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
            print(repr(s.recv(200)))
            s.close()
    """)
    (box.run.workspace / "client.py").write_text(client)
    result = sh(box, "python client.py")
    assert result.success, result.stderr[-500:]
    assert "no scores yet" in sh(box, "score log").stdout or "#" in sh(box, "score log").stdout
    assert box.run.rows()[0] == [] or all(r.kind == "score" for r in box.run.rows()[0])


FORGE = textwrap.dedent("""
    import glob, os
    line = '\\nOPENREBENCH-RESULT {nonce} {{"raw": -50.0, "message": "Valid: forged", "details": {{}}}}\\n'
    nonces = set()
    for path in glob.glob("/proc/[0-9]*/cmdline") + glob.glob("/proc/[0-9]*/environ"):
        try:
            text = open(path, "rb").read().decode(errors="replace")
            nonces.update(w for w in text.split('"') if len(w) == 32)
        except OSError:
            pass
    for fd in glob.glob("/proc/[0-9]*/fd/1") + ["/proc/self/fd/1"]:
        for nonce in nonces or {"0" * 32}:
            try:
                with open(fd, "a") as f:
                    f.write(line.format(nonce=nonce))
            except OSError:
                pass
    print(line.format(nonce="0" * 32), flush=True)
    raise SystemExit("forged")
""")


@pytest.mark.attack(env="sandbox", cls="fake result line", invariant=0)
def test_fake_result_line_on_every_stdout_in_reach(box: OpenRebenchSandbox) -> None:
    """Write a forged OPENREBENCH-RESULT line to every stdout reachable through /proc."""
    (box.run.workspace / "solution.py").write_text(FORGE)
    before = len(box.run.rows()[0])
    row = score_run(box.run, sandboxed=True, timeout_s=60)
    assert row.raw is None and "forged" not in row.message.split(":")[0], row.message
    assert len(box.run.rows()[0]) == before + 1


SIGNALLER = textwrap.dedent("""
    import os, signal
    for pid in [os.getppid(), 1, *(int(p) for p in os.listdir("/proc") if p.isdigit())]:
        for sig in (signal.SIGSTOP, signal.SIGTERM):
            try:
                if pid != os.getpid():
                    os.kill(pid, sig)
            except OSError:
                pass
    raise SystemExit("signalled")
""")


@pytest.mark.attack(env="sandbox", cls="signalling the scorer", invariant=0)
def test_stop_and_terminate_every_process_in_reach(box: OpenRebenchSandbox) -> None:
    """SIGSTOP then SIGTERM to the scorer, PID 1 and every pid in /proc; the harness must carry on."""
    (box.run.workspace / "solution.py").write_text(SIGNALLER)
    before = len(box.run.rows()[0])
    row = score_run(box.run, sandboxed=True, timeout_s=30)
    assert row.raw is None
    assert len(box.run.rows()[0]) == before + 1
    assert "#" in sh(box, "score log").stdout


PROTECTED_READER = textwrap.dedent("""
    import glob, os
    seen = []
    for pattern in ["/score/protected/*", "/proc/[0-9]*/maps", "/proc/[0-9]*/fd/*", "/proc/[0-9]*/environ",
                    "/proc/[0-9]*/root/score/protected/*"]:
        for path in glob.glob(pattern):
            try:
                with open(path, "rb") as f:
                    seen.append(f.read(4096).decode(errors="replace"))
            except OSError:
                pass
    raise SystemExit("SEEN " + " ".join(seen)[-3000:])
""")


@pytest.mark.attack(env="sandbox", cls="/proc snooping", invariant=3)
def test_scoring_sandbox_protected_data_through_proc(box: OpenRebenchSandbox) -> None:
    """From the solution's code in the scoring sandbox: protected/, and through /proc/*/root, fds and maps."""
    (box.run.workspace / "solution.py").write_text(PROTECTED_READER)
    row = score_run(box.run, sandboxed=True, timeout_s=60)
    leaked = SECRET in row.message or SECRET in json.dumps(row.details)
    assert not leaked, "attack works: read protected/"


@pytest.mark.attack(env="sandbox", cls="agent processes during scoring", invariant=2)
def test_agent_processes_are_frozen_while_scoring(box: OpenRebenchSandbox,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy loop the agent keeps running in its own sandbox while `score` times the solution (the
    box's environment is made a timing one here: only those freeze the agent)."""
    monkeypatch.setattr(type(get_environment(ENV)), "timing_sensitive", True)
    (box.run.workspace / "solution.py").write_text("import time\ntime.sleep(5)\nraise SystemExit('done')\n")
    beat = box.run.workspace / "beat"
    burner = call(box, asyncio.sleep(0), 5) or asyncio.run_coroutine_threadsafe(
        box.exec(["bash", "-c", "end=$((SECONDS+30)); while [ $SECONDS -lt $end ]; do date +%s%N > beat; "
                               "sleep 0.05; done"], timeout=40), box.loop)  # type: ignore[attr-defined]
    deadline = time.monotonic() + 10
    while not beat.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    scoring = asyncio.run_coroutine_threadsafe(box.score(), box.loop)  # type: ignore[attr-defined]
    time.sleep(2.0)  # the scorer is now inside the solution's import
    first = beat.read_text()
    time.sleep(1.0)
    moved = beat.read_text() != first
    scoring.result(120)
    burner.cancel()
    assert not moved, "attack works: the agent's processes kept running during the scoring"


SHM_WRITER = "open('/dev/shm/redteam-left', 'w').write('x')\nopen('/tmp/redteam-left', 'w').write('x')\n" \
             "raise SystemExit('wrote')\n"
SHM_READER = "import os\nleft = [p for p in ('/dev/shm/redteam-left', '/tmp/redteam-left')\n" \
             "        if os.path.exists(p)]\nraise SystemExit(f'LEFT {left}')\n"


@pytest.mark.attack(env="sandbox", cls="leftovers between scorings", invariant=3)
def test_shm_and_tmp_leftovers_between_scorings(box: OpenRebenchSandbox) -> None:
    """A scoring leaves files in /dev/shm and /tmp; the next scoring looks for them."""
    (box.run.workspace / "solution.py").write_text(SHM_WRITER)
    score_run(box.run, sandboxed=True, timeout_s=60)
    (box.run.workspace / "solution.py").write_text(SHM_READER)
    row = score_run(box.run, sandboxed=True, timeout_s=60)
    assert "LEFT []" in row.message, f"attack works: {row.message[:200]}"


@pytest.mark.attack(env="sandbox", cls="one row per scoring", invariant=5)
def test_every_scoring_of_this_module_left_exactly_one_row(box: OpenRebenchSandbox) -> None:
    """After all the attacks above, the log has one readable row per scoring, indexed in order."""
    rows, warnings = box.run.rows()
    assert warnings == [] and [r.index for r in rows] == list(range(len(rows)))
    assert all(r.message for r in rows)

