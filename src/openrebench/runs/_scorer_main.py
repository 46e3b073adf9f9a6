"""Entry point of the scorer process: read the config from stdin, score, print one tagged result line.

First of all the process makes itself non-dumpable: where the harness runs without root, the scorer
and the solution's processes share a uid, and a dumpable scorer would let the solution read its
memory, environment and file descriptors through /proc (or ptrace it) and forge the result.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

PR_SET_DUMPABLE = 4


def make_non_dumpable() -> bool:
    """prctl(PR_SET_DUMPABLE, 0): /proc/<pid>/{mem,environ,fd} become root's, and ptrace is refused."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def failure_message(e: BaseException, protected: str) -> tuple[str, bool]:
    """A fixed description of an exception that escaped the environment's scorer, and whether it is
    the harness's fault. Never the exception's text: it may hold held-out values."""
    filename = getattr(e, "filename", None)
    if isinstance(e, OSError) and isinstance(filename, str) and protected and filename.startswith(protected):
        return ("Invalid: infrastructure failure (a protected file of the run is missing or unreadable), not "
                "caused by your solution; the details are in the run's score log."), True
    name = type(e).__name__ if type(e).__module__ == "builtins" else "an exception"
    return (f"Invalid: the scorer failed with an internal error ({name}) while scoring this solution; the "
            "details are in the run's score log."), False


def _score(env: Any, config: dict[str, Any]) -> Any:
    from openrebench.api import ScoreResult

    from ._scorer_process import READY_TAG

    try:
        sys.stdout.write(f"\n{READY_TAG} {config['nonce']}\n")
        sys.stdout.flush()
        result = env.score(config["tier"], Path(config["solution"]), Path(config["protected"]))
        if not isinstance(result, ScoreResult):
            raise TypeError("the scorer returned no ScoreResult")
    except BaseException as e:  # SystemExit and KeyboardInterrupt too: there is always one result line
        message, infrastructure = failure_message(e, str(config.get("protected", "")))
        result = ScoreResult.invalid(message, infrastructure=infrastructure, traceback=traceback.format_exc())
    return result


def main() -> None:
    started = time.time()
    dumpable_off = make_non_dumpable()
    config = json.loads(sys.stdin.read())
    from openrebench.api import ScoreResult

    from ._scorer_process import RESULT_TAG

    try:
        from ._registry import by_class_path, get_environment

        # The harness names the class: this one environment is imported, not every installed one.
        env = (by_class_path(config["env_class"], config["env_id"]) if config.get("env_class")
               else get_environment(config["env_id"]))
    except Exception as e:  # an environment (a plug-in) this process cannot load: never the solution's fault
        result = ScoreResult.invalid(
            f"Invalid: infrastructure failure (the scorer process cannot load the environment "
            f"'{config['env_id']}'), not caused by your solution; the details are in the run's score log.",
            infrastructure=True, error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
    else:
        loaded = time.time()
        result = _score(env, config)
        launched = config.get("launched_at")
        if isinstance(launched, int | float):  # where a slow scoring's time goes, outside the scorer's own
            result.details["harness_phases_s"] = {
                "scorer_start": round(started - launched, 3), "environment_load": round(loaded - started, 3),
                "score": round(time.time() - loaded, 3)}
    result.details["scorer_non_dumpable"] = dumpable_off
    try:
        line = result.model_dump_json()
    except Exception as e:  # details that do not serialise must not cost the result line
        line = ScoreResult.invalid("Invalid: the scorer produced a result that cannot be recorded.",
                                   error=type(e).__name__).model_dump_json()
    sys.stdout.write(f"\n{RESULT_TAG} {config['nonce']} {line}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
    # The result line is out: skip the interpreter's teardown (a CUDA context's alone took 0.6 s of every
    # GPU scoring on an H100); the harness ends whatever is left of the process's tree.
    sys.stderr.flush()
    os._exit(0)
