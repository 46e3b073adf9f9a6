"""The solution host: the only process that runs the agent's code.

It imports `solution.py` from the solution snapshot when the scorer starts it, says it is ready (or
why it cannot be), then answers one request: the held-out xs, never their ys. Nothing it says is
trusted: the scorer checks the shape of every answer.
"""

from __future__ import annotations

import importlib.util
import sys
import traceback
from pathlib import Path
from typing import Any

from openrebench.api import HostChannel


def _load(solution_dir: Path) -> Any:
    path = solution_dir / "solution.py"
    if not path.is_file():
        return "solution.py is missing from the workspace"
    sys.path.insert(0, str(solution_dir))
    try:
        spec = importlib.util.spec_from_file_location("solution", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["solution"] = module
        spec.loader.exec_module(module)
    except BaseException as e:  # SystemExit too: the agent's code must not end the host silently
        return f"solution.py failed to import: {type(e).__name__}: {e}"
    predict = getattr(module, "predict", None)
    return predict if callable(predict) else "solution.py must define predict(xs) -> list[float]"


def main() -> None:
    solution_dir, channel = HostChannel.from_argv()
    predict = _load(solution_dir)
    if isinstance(predict, str):
        channel.send({"error": predict})
        return
    channel.send({"ready": True})
    request = channel.receive()
    try:
        out = predict(list(request["xs"]))
        channel.send({"predictions": [float(v) for v in out]})
    except BaseException as e:
        frames = "".join(traceback.format_exception(e)[-3:])
        channel.send({"error": f"predict(xs) raised {type(e).__name__}: {e}\n{frames}"})


if __name__ == "__main__":
    main()
