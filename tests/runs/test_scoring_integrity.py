"""The snapshot and the score log under attack: swapped links and FIFOs, vanishing and changing files,
a full disk, a failing harness or scorer, garbage on the scoring socket. Every scoring ends in one row."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from openrebench.api import OpenRebenchError
from openrebench.runs import Run, _score_log, _scoring, _snapshot, score_run, snapshot_workspace
from openrebench.runs._scorer_main import failure_message


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder outside the workspace holding a secret, as protected data would be."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret.txt").write_text("TOP SECRET held-out data")
    return folder


def workspace_with(tmp_path: Path, files: dict[str, str]) -> Path:
    ws = tmp_path / "ws"
    for rel, text in files.items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(text)
    ws.mkdir(exist_ok=True)
    return ws


def copied(dest: Path) -> dict[str, bytes]:
    return {str(p.relative_to(dest)): p.read_bytes() for p in dest.rglob("*") if p.is_file()}


def test_links_fifos_and_sockets_already_there_are_skipped(tmp_path: Path, outside: Path) -> None:
    ws = workspace_with(tmp_path, {"a.py": "x = 1\n", "sub/b.py": "y = 2\n"})
    (ws / "link.txt").symlink_to(outside / "secret.txt")
    (ws / "linkdir").symlink_to(outside)
    os.mkfifo(ws / "pipe")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(ws / "sock"))
        sha, notes = snapshot_workspace(ws, tmp_path / "dest")
    assert copied(tmp_path / "dest") == {"a.py": b"x = 1\n", "sub/b.py": b"y = 2\n"}
    assert len(notes) == 4 and any("link link.txt" in n for n in notes)
    assert sha == snapshot_workspace(ws, tmp_path / "dest2")[0]


def test_a_fifo_swapped_in_after_the_listing_never_blocks(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    ws = workspace_with(tmp_path, {"a.txt": "regular"})

    def swap(rel: str) -> None:
        if rel == "a.txt":
            (ws / "a.txt").unlink()
            os.mkfifo(ws / "a.txt")  # nobody will ever write to it

    monkeypatch.setattr(_snapshot, "_before_open", swap)
    box: dict[str, object] = {}
    worker = threading.Thread(target=lambda: box.update(out=snapshot_workspace(ws, tmp_path / "dest")),
                              daemon=True)
    worker.start()
    worker.join(20)
    assert not worker.is_alive(), "the snapshot blocked on a FIFO"
    assert copied(tmp_path / "dest") == {}
    assert any("replaced" in n for n in box["out"][1])  # type: ignore[index]


@pytest.mark.parametrize("what", ["file", "folder"])
def test_a_link_swapped_in_after_the_listing_is_not_followed(tmp_path: Path, outside: Path, what: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    ws = workspace_with(tmp_path, {"a.txt": "mine", "sub/b.txt": "mine too"})

    def swap(rel: str) -> None:
        if what == "file" and rel == "a.txt":
            (ws / "a.txt").unlink()
            (ws / "a.txt").symlink_to(outside / "secret.txt")
        if what == "folder" and rel == "sub":
            (ws / "sub").rename(tmp_path / "moved")
            (ws / "sub").symlink_to(outside)

    monkeypatch.setattr(_snapshot, "_before_open", swap)
    _, notes = snapshot_workspace(ws, tmp_path / "dest")
    assert not any(b"SECRET" in data for data in copied(tmp_path / "dest").values())
    assert any("replaced" in n for n in notes)


def test_a_folder_renamed_mid_walk_cannot_lead_outside(tmp_path: Path, outside: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk holds the folder's descriptor: renaming it and putting a link in its place changes nothing."""
    ws = workspace_with(tmp_path, {"sub/deeper/c.txt": "mine"})

    def swap(rel: str) -> None:
        if rel == "sub/deeper":
            (ws / "sub").rename(tmp_path / "elsewhere")
            (ws / "sub").symlink_to(outside)

    monkeypatch.setattr(_snapshot, "_before_open", swap)
    snapshot_workspace(ws, tmp_path / "dest")
    assert copied(tmp_path / "dest") == {"sub/deeper/c.txt": b"mine"}


def test_a_vanished_file_is_skipped_with_a_note(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ws = workspace_with(tmp_path, {"a.txt": "a", "b.txt": "b", "gone/c.txt": "c"})

    def remove(rel: str) -> None:
        if rel == "a.txt":
            (ws / "a.txt").unlink()
        if rel == "gone":
            (ws / "gone" / "c.txt").unlink()
            (ws / "gone").rmdir()

    monkeypatch.setattr(_snapshot, "_before_open", remove)
    _, notes = snapshot_workspace(ws, tmp_path / "dest")
    assert copied(tmp_path / "dest") == {"b.txt": b"b"}
    assert sum("removed while the snapshot was taken" in n for n in notes) == 2


def test_a_file_changing_while_copied_gives_one_clear_invalid_row(kernel_run: Run,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    target = kernel_run.workspace / "growing.log"
    target.write_text("step 1\n")
    real_read = _snapshot._read

    def read(fd: int, n: int) -> bytes:
        data = real_read(fd, n)
        if data == b"step 1\n":
            with open(target, "a") as f:
                f.write("step 2\n")
        return data

    monkeypatch.setattr(_snapshot, "_read", read)
    monkeypatch.setattr(_scoring, "score_solution",
                        lambda *a, **k: pytest.fail("scored an inconsistent copy"))
    row = score_run(kernel_run, sandboxed=False)
    assert row.raw is None and "growing.log changed while the snapshot was taken" in row.message
    assert len(kernel_run.rows()[0]) == 1


@pytest.mark.parametrize("limit, value, expected", [("MAX_SNAPSHOT_FILES", 4, "more than 4 files and"),
                                                    ("MAX_SNAPSHOT_DEPTH", 1, "nested deeper than 1"),
                                                    ("MAX_SNAPSHOT_BYTES", 10, "snapshot limit")])
def test_limits_give_a_clear_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, limit: str, value: int,
                                     expected: str) -> None:
    ws = workspace_with(tmp_path, {"a/b/c/d.txt": "0123456789abc", "e.txt": "e", "f.txt": "f"})
    if limit == "MAX_SNAPSHOT_BYTES":  # a tier's own (TierSpec.max_workspace_gb), passed in
        with pytest.raises(OpenRebenchError, match=expected):
            snapshot_workspace(ws, tmp_path / "dest", max_bytes=value)
        return
    monkeypatch.setattr(_snapshot, limit, value)
    with pytest.raises(OpenRebenchError, match=expected):
        snapshot_workspace(ws, tmp_path / "dest")


def test_a_tier_sets_its_own_workspace_limit() -> None:
    """chat_rl's full tier holds two GPT-2 XL checkpoints (6.2 GB each in fp32): over the 4 GiB default."""
    from openrebench.runs import get_environment

    assert get_environment("optimize_kernel").tier("mini").max_workspace_gb == 4
    assert get_environment("chat_rl").tier("full").max_workspace_gb >= 16


def test_a_workspace_replaced_by_a_link_is_invalid_not_followed(kernel_run: Run, outside: Path) -> None:
    os.rename(kernel_run.workspace, kernel_run.path / "old")
    kernel_run.workspace.symlink_to(outside)
    row = score_run(kernel_run, sandboxed=False)
    assert row.raw is None and "workspace cannot be opened" in row.message


def test_a_harness_failure_still_gives_exactly_one_row(kernel_run: Run,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("cgroup could not be made")

    monkeypatch.setattr(_scoring, "score_solution", broken)
    row = score_run(kernel_run, sandboxed=False)
    assert row.raw is None and row.message.startswith("Invalid: infrastructure failure")
    assert "not caused by your solution" in row.message and "cgroup" not in row.message
    assert "cgroup could not be made" in row.details["error"] and row.details["infrastructure"] is True

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(_scoring, "score_solution", interrupted)
    with pytest.raises(KeyboardInterrupt):
        score_run(kernel_run, sandboxed=False)
    rows, warnings = kernel_run.rows()
    assert [r.index for r in rows] == [0, 1] and not warnings and "interrupted" in rows[1].message


def test_missing_protected_files_are_an_infrastructure_failure(kernel_run: Run) -> None:
    (kernel_run.protected / "heldout.bin").write_bytes(b"data")
    _scoring._record_protected(kernel_run)
    (kernel_run.protected / "heldout.bin").unlink()
    row = score_run(kernel_run, sandboxed=False)
    assert row.raw is None and "infrastructure failure" in row.message and "heldout.bin" in row.message


def test_a_full_disk_still_gets_the_row_through_the_reserve(kernel_run: Run,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    reserve = _score_log.reserve_path(kernel_run.score_log_path)
    assert reserve.stat().st_size == _score_log.RESERVE_BYTES and reserve.stat().st_mode & 0o077 == 0
    real_write = _score_log._write
    full = {"disk": True}

    def write(fd: int, data: bytes) -> int:
        if full["disk"]:
            if reserve.exists():
                raise OSError(errno.ENOSPC, "No space left on device")
            full["disk"] = False  # the freed reserve makes room
        return real_write(fd, data)

    monkeypatch.setattr(_score_log, "_write", write)
    monkeypatch.setattr(_scoring, "score_solution",
                        lambda *a, **k: _scoring.ScoreResult.invalid("Invalid: x."))
    row = score_run(kernel_run, sandboxed=False)
    assert kernel_run.rows()[0] == [row]
    assert reserve.is_file()  # made again for the next time


def test_the_scorer_process_always_answers_without_the_exception_text(tmp_path: Path) -> None:
    """An environment whose scorer raises with held-out values in the message: one result line, a fixed
    message, the traceback only in the hidden details; the process is not dumpable."""
    script = (
        "import sys\nfrom openrebench.runs import _registry, _scorer_main\n"
        "class Env:\n"
        "    def score(self, *a):\n"
        "        raise IndexError('index 31337 is out of bounds: held-out token')\n"
        "_registry.get_environment = lambda _id: Env()\n"
        "_scorer_main.main()\n")
    config = {"env_id": "x", "tier": "mini", "nonce": "n0", "solution": str(tmp_path),
              "protected": str(tmp_path / "protected")}
    out = subprocess.run([sys.executable, "-c", script], input=json.dumps(config), capture_output=True,
                         text=True, timeout=120)
    lines = [x for x in out.stdout.splitlines() if x.startswith("OPENREBENCH-RESULT n0 ")]
    assert out.returncode == 0 and len(lines) == 1, out.stderr
    result = json.loads(lines[0].split(" ", 2)[2])
    assert result["raw"] is None and "internal error (IndexError)" in result["message"]
    assert "31337" not in result["message"] and "31337" in result["details"]["traceback"]
    assert result["details"]["scorer_non_dumpable"] is True


def test_an_environment_the_scorer_process_cannot_load_is_an_infrastructure_failure(tmp_path: Path) -> None:
    """A plug-in the scorer process does not find (not visible in its sandbox, say) is never blamed on
    the solution."""
    config = {"env_id": "not_installed", "tier": "mini", "nonce": "n1", "solution": str(tmp_path),
              "protected": str(tmp_path / "protected")}
    out = subprocess.run([sys.executable, "-m", "openrebench.runs._scorer_main"], input=json.dumps(config),
                         capture_output=True, text=True, timeout=120)
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("OPENREBENCH-RESULT n1 ")]
    result = json.loads(line.split(" ", 2)[2])
    assert result["raw"] is None and result["details"]["infrastructure"] is True
    assert "cannot load the environment 'not_installed'" in result["message"]
    assert "unknown environment 'not_installed'" in result["details"]["error"]


def test_failure_messages_name_missing_protected_files_as_infrastructure() -> None:
    message, infra = failure_message(FileNotFoundError(2, "No such file", "/score/protected/heldout.bin"),
                                     "/score/protected")
    assert infra and "infrastructure failure" in message and "heldout" not in message
    message, infra = failure_message(SystemExit("value 12345"), "/score/protected")
    assert not infra and "12345" not in message


def test_make_non_dumpable_takes_effect() -> None:
    code = ("import ctypes\nfrom openrebench.runs._scorer_main import make_non_dumpable\n"
            "assert make_non_dumpable()\nprint(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "0", out.stderr


def test_the_scoring_socket_answers_garbage_and_failures_in_one_line(kernel_run: Run,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from openrebench.harness import OpenRebenchSandbox, SandboxConfig

    async def scenario() -> list[str]:
        box = await OpenRebenchSandbox.for_run(kernel_run, SandboxConfig(env_id="optimize_kernel",
                                                                          isolation="none"))

        async def broken_score() -> None:
            raise RuntimeError("the GPU lease vanished")

        monkeypatch.setattr(box, "score", broken_score)
        path = str(box.harness_dir / "run" / "score.sock")
        answers = []
        try:
            for request in (b"\xff\xfe garbage\n", b"[1, 2]\n", b"{" * 100_000 + b"\n", b'{"op": "rm"}\n',
                            b'{"op": "score"}\n', b'{"op": "log"}\n'):
                reader, writer = await asyncio.open_unix_connection(path)
                writer.write(request)
                await writer.drain()
                answers.append(json.loads(await asyncio.wait_for(reader.read(), 30))["text"])
                writer.close()
        finally:
            await box.close()
        return answers

    answers = asyncio.run(scenario())
    assert all("\n" not in a for a in answers[:5]), answers
    assert answers[0].startswith("malformed") and answers[2].startswith("malformed")
    assert answers[1].startswith("unknown request") and answers[3].startswith("unknown request")
    assert "infrastructure failure" in answers[4] and "GPU lease" not in answers[4]
    assert answers[5] == "no scores yet"
