"""The janitor: what a harness that died was holding (cgroups, folders) is cleaned up after it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HARNESS = """
import os, sys
from pathlib import Path
held = [os.open("/dev/null", os.O_RDONLY) for _ in range(int(sys.argv[2]))]  # the pipe's fds pass 9
from openrebench.isolation import _janitor
_janitor.track("dir", Path(sys.argv[1]))
print(_janitor.janitor_pid(), flush=True)
os._exit(0)  # dies without cleaning up
"""


def test_a_folder_a_dead_harness_held_is_removed_whatever_its_descriptors(tmp_path: Path) -> None:
    for held in (0, 20):
        target = tmp_path / f"left-{held}"
        target.mkdir()
        (target / "file").write_text("x")
        out = subprocess.run([sys.executable, "-c", HARNESS, str(target), str(held)], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.strip().isdigit(), out.stderr
        deadline = time.monotonic() + 20
        while target.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not target.exists(), f"the janitor left {target} (harness holding {held} more descriptors)"
