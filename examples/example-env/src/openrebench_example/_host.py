"""The solution host: the only process that runs the agent's code.

It imports `solution.py` from the solution snapshot when the scorer starts it, says it is ready (or
why it cannot be), then answers one request: the held-out xs, never their ys. Nothing it says is
trusted: the scorer checks the shape of every answer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from openrebench.api import HostChannel, import_solution, solution_traceback


def _load(solution_dir: Path) -> Any:
    module = import_solution(solution_dir)  # by path, from the snapshot: a one-line reason where it fails
    if isinstance(module, str):
        return module
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
        channel.send({"error": f"predict(xs) raised {solution_traceback(e, solution_dir)}"})


if __name__ == "__main__":
    main()
