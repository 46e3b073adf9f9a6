"""The solution host: the only process that runs the agent's code.

It imports `solution.py`, calls `get_trained_model()`, records the model's forward pass on two inputs
of random tokens sent by the scorer (never held-out text), checks that the two recordings are one
computation, and sends the graph and its constants to the scorer; afterwards it answers requests for
rows of the logits it computed, which the scorer compares with its own replay of the graph. Nothing
it reports is trusted: the scorer checks the graph against the rules and computes the score itself.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from openrebench.api import HostChannel, import_solution, solution_traceback

from ._graph import RuleViolation, difference, pack_constants, trace
from ._rules import ALLOWED_SUMMARY
from ._wire import send_blob


def _load_model(solution_dir: Path) -> torch.nn.Module | str:
    module = import_solution(solution_dir)
    if isinstance(module, str):
        return module
    get = getattr(module, "get_trained_model", None)
    if not callable(get):
        return "solution.py does not define a function get_trained_model()"
    try:
        model = get()
    except BaseException as e:
        return f"get_trained_model() raised {solution_traceback(e, solution_dir)}"
    if not isinstance(model, torch.nn.Module):
        return f"get_trained_model() returned {type(model).__name__}; it must return a torch.nn.Module"
    return model


def main() -> None:
    solution_dir, channel = HostChannel.from_argv()
    setup = channel.receive()
    device = torch.device(setup["device"])
    if setup.get("threads"):
        torch.set_num_threads(int(setup["threads"]))
    batch, length, vocab = (int(v) for v in (setup["batch_size"], setup["seq_len"], setup["vocab_size"]))
    inputs = [torch.tensor(seq, dtype=torch.int64, device=device).reshape(batch, length)
              for seq in setup["inputs"]]

    start = time.perf_counter()
    model = _load_model(solution_dir)
    if isinstance(model, str):
        channel.send({"error": model})
        return
    loaded = time.perf_counter()
    try:
        model.to(device)
        model.eval()
        first, second = trace(model, inputs[0]), trace(model, inputs[1])
    except RuleViolation as e:
        channel.send({"error": f"{e}. Allowed in the forward pass: {ALLOWED_SUMMARY}."})
        return
    except BaseException as e:
        channel.send({"error": f"the forward pass raised {solution_traceback(e, solution_dir)}"})
        return
    traced = time.perf_counter()
    out = first.output
    if tuple(out.shape) != (batch, length, vocab) or not out.dtype.is_floating_point:
        channel.send({"error": f"the model returned logits of shape {tuple(out.shape)} and dtype "
                               f"{out.dtype}; expected shape ({batch}, {length}, {vocab}) and a "
                               "floating-point dtype"})
        return
    packed, packed_second = pack_constants(first.constants), pack_constants(second.constants)
    if problem := difference(first, second, packed, packed_second):
        channel.send({"error": problem})
        return
    del second, packed_second
    graph = json.dumps({"nodes": first.nodes, "output": first.output_ref, "constants": packed[0],
                        "storage_sizes": [len(s) for s in packed[1]]}).encode()
    channel.send({"ready": True, "load_s": loaded - start, "trace_s": traced - loaded})
    send_blob(channel.send, {"graph_bytes": len(graph)}, graph + b"".join(packed[1]))
    del packed, graph

    while True:
        request = channel.receive()
        if request.get("op") != "rows":
            return
        rows = torch.stack([out[int(b), int(t)] for b, t in request["positions"]])
        send_blob(channel.send, {"rows": len(rows)}, rows.float().cpu().numpy().tobytes())


if __name__ == "__main__":
    main()
