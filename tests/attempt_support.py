"""An attempt's sandbox on the example environment, driven from a test: commands, a scoring, its end."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from openrebench.harness import OpenRebenchSandbox, SandboxConfig
from openrebench.runs import Run, start_run

MIB = 1 << 20
FLOOD = """
import errno, os, sys
written = 0
try:
    with open(sys.argv[1], "wb") as f:
        while written < int(sys.argv[2]) << 20:
            f.write(b"x" * (1 << 20))
            f.flush()
            written += 1 << 20
        os.fsync(f.fileno())
except OSError as e:
    print("full" if e.errno == errno.ENOSPC else f"error {e.errno}", written >> 20)
else:
    print("wrote", written >> 20)
"""


class Attempt:
    """One attempt's sandbox (bubblewrap) on a disk of `disk_gb` where the harness can make one."""

    def __init__(self, path: Path, disk_gb: float) -> None:
        self.loop = asyncio.new_event_loop()
        self.run: Run = start_run("example_fit", "mini", path, score_start=False)[0]
        config = SandboxConfig(env_id="example_fit", memory_limit_gb=1, disk_gb=disk_gb)
        self.box = self.loop.run_until_complete(OpenRebenchSandbox.for_run(self.run, config))

    def sh(self, script: str) -> str:
        result = self.loop.run_until_complete(self.box.exec(["bash", "-c", script], timeout=120))
        assert result.success, result.stderr
        return result.stdout

    def close(self) -> None:
        self.loop.run_until_complete(self.box.close())
        self.loop.close()


@pytest.fixture
def attempts(tmp_path: Path) -> Iterator[list[Attempt]]:
    made: list[Attempt] = []
    yield made
    for attempt in made:
        attempt.close()
