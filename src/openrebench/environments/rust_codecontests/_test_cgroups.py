"""The scorer's cgroup per test: each program it judges runs in a sub-group of the solution's cgroup of its
own, killed whole when its test ends, so that a process the program forked, moved to a session of its
own and detached from our pipes does not outlive its test either. Apart from rust_utils because the
agent's workspace gets a copy of that file, which must stand alone, and the agent has no cgroup to give.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import rust_utils

_GROUP_IDS = itertools.count()


def _own_group(cgroup: Any) -> Any:
    """A fresh sub-group of `cgroup` for one command, or None (no cgroup given, or none can be made)."""
    if cgroup is None:
        return None
    try:
        return cgroup.child(f"cmd-{os.getpid()}-{next(_GROUP_IDS)}")
    except OSError:
        return None


async def run_test(binary: Path, input_text: str, expected: str, *, cgroup: Any = None,
                   prefix: Sequence[str] = (), **kw: Any) -> rust_utils.TestOutcome:
    """rust_utils.run_test, the program in a fresh sub-group of `cgroup` (the scorer's: an object with
    `child(name)`, `enter_prefix()` and `close()`), killed whole when the test ends; without one, or where
    none can be made, as rust_utils runs it."""
    group = _own_group(cgroup)
    if group is None:
        return await rust_utils.run_test(binary, input_text, expected, prefix=prefix, **kw)
    try:
        return await rust_utils.run_test(binary, input_text, expected,
                                         prefix=[*group.enter_prefix(), *prefix], **kw)
    finally:
        await asyncio.get_running_loop().run_in_executor(None, group.close)


async def evaluate_program(source: str, tests: Sequence[tuple[str, str]], *, cgroup: Any = None,
                           **kw: Any) -> rust_utils.ProgramResult:
    """rust_utils.evaluate_program, each test's program in a cgroup of its own (see run_test)."""
    return await rust_utils.evaluate_program(source, tests, run=functools.partial(run_test, cgroup=cgroup),
                                             **kw)
