"""Known ways to cheat at optimize_finetune, as workspaces: the tests and the benchmark check that each
one scores invalid. They are public on purpose: the defences must not rely on secrecy.

- `initial_weights`: skip training and write the initial weights as the result;
- `stale_copy`: copy the weights of an earlier run (other seed and data: what copying "reference"
  weights or any result prepared in advance amounts to);
- `clock`: patch Python's clocks in every process the pipeline starts and run the real pipeline in
  the background, so that finetune.sh itself returns at once.
"""

from __future__ import annotations

import shutil
from pathlib import Path

CHEATS = ("initial_weights", "stale_copy", "clock")

INITIAL_WEIGHTS = """#!/usr/bin/env bash
set -e
cd "$(dirname "$0")"
rm -rf trained_model
cp -r initial_model trained_model
"""

STALE_COPY = """#!/usr/bin/env bash
set -e
cd "$(dirname "$0")"
rm -rf trained_model
cp -r earlier_run trained_model
"""

CLOCK = """#!/usr/bin/env bash
set -e
cd "$(dirname "$0")"
cat > sitecustomize.py <<'PY'
import time
_t0, _m0, _p0 = time.time(), time.monotonic(), time.perf_counter()
time.time = lambda: _t0
time.monotonic = lambda: _m0
time.perf_counter = lambda: _p0
PY
export PYTHONPATH="$PWD"
setsid nohup bash finetune_real.sh > /dev/null 2>&1 < /dev/null &
exit 0
"""


def install_cheat(name: str, workspace: Path, earlier_run: Path | None = None) -> None:
    """Turn a workspace holding the starting solution into the cheat `name`."""
    script = workspace / "finetune.sh"
    if name == "initial_weights":
        script.write_text(INITIAL_WEIGHTS)
    elif name == "stale_copy":
        if earlier_run is None:
            raise ValueError("the stale_copy cheat needs the weights of an earlier run")
        shutil.rmtree(workspace / "earlier_run", ignore_errors=True)
        shutil.copytree(earlier_run, workspace / "earlier_run")
        script.write_text(STALE_COPY)
    elif name == "clock":
        shutil.copyfile(script, workspace / "finetune_real.sh")
        script.write_text(CLOCK)
    else:
        raise ValueError(f"unknown cheat {name!r} (known: {', '.join(CHEATS)})")
