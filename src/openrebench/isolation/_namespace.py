"""Process isolation available without a sandbox: a private PID namespace for the scorer.

Inside it the scorer is PID 1, so solution code cannot see or signal the harness (a solution that
"kills its parent" can only reach the scorer, whose death the harness reports as an invalid score).
Filesystem and user isolation belong to the sandbox (bubblewrap) in the harness.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess


@functools.cache
def pid_namespace_prefix() -> tuple[str, ...]:
    """A command prefix that runs a program in a new PID namespace, or () where none can be made."""
    if os.environ.get("OPENREBENCH_NO_PIDNS") or not shutil.which("unshare"):
        return ()
    base = ("unshare", "--pid", "--fork", "--kill-child", "--mount-proc")
    candidates = [base] if os.geteuid() == 0 else []
    candidates.append(("unshare", "--user", "--map-root-user", *base[1:]))
    for prefix in candidates:
        try:
            if subprocess.run([*prefix, "true"], capture_output=True, timeout=10).returncode == 0:
                return prefix
        except (OSError, subprocess.SubprocessError):
            continue
    return ()
