"""The agents' own costs: each scaffold's time per step outside model and tool calls, and the gateway's
streaming against a direct call to the same model.

1. Scaffolds. Each built-in model scaffold (react, modular, aide) runs one scripted attempt (Inspect's
   mockllm, which answers at once) on optimize_kernel's mini tier through its real sandbox. Every
   interval spent in a model call or a tool call (from the Inspect log) or in the sandbox (its exec,
   file reads and writes and scorings, timed here around the sandbox's methods) is taken out; what is
   left between the end of one model call and the start of the next is the scaffold's own time for that
   step: building the prompt, parsing the reply, trimming the context, the search tree's bookkeeping,
   Inspect's own loop. The target is a median of at most 50 ms.
2. Streaming. A fake OpenAI-compatible upstream streams a 40-chunk answer (a chunk every 5 ms); the
   same streamed request goes straight to it and through the gateway and the sandbox's forwarder (what
   an agent's client uses), interleaved. Reported: the time to the first chunk and to the end of the
   stream, medians, and the paired median of what the gateway adds.

    .venv/bin/python benchmarks/agents.py --out benchmarks/results/agents/$(date +%F)_amd_epyc.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gateway import TOKEN, process, serve_chat

STEPS = 30  # tool-calling turns of the react and modular scripts
STREAM_CHUNKS, CHUNK_DELAY_S = 40, 0.005


def _intervals_of(log: Any) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """The model calls' intervals, in order, and the tool calls' (wall-clock seconds)."""
    (sample,) = log.samples
    model, tools = [], []
    for event in sample.events:
        if event.event in ("model", "tool") and event.completed is not None:
            span = (event.timestamp.timestamp(), event.completed.timestamp())
            (model if event.event == "model" else tools).append(span)
    return sorted(model), tools


def _covered(lo: float, hi: float, spans: list[tuple[float, float]]) -> float:
    """How much of [lo, hi] the spans cover (overlaps counted once)."""
    total, reach = 0.0, lo
    for a, b in sorted((max(a, lo), min(b, hi)) for a, b in spans if b > lo and a < hi):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


def own_step_times(log: Any, sandbox_spans: list[tuple[float, float]]) -> list[float]:
    """Per step: the time between one model call's end and the next one's start that no tool call and no
    sandbox operation covered."""
    model, tools = _intervals_of(log)
    spans = tools + sandbox_spans
    return [(b0 - a1) - _covered(a1, b0, spans) for (_, a1), (b0, _) in itertools.pairwise(model)]


def _record_sandbox(spans: list[tuple[float, float]]) -> Callable[[], None]:
    """Time every sandbox operation an agent can cause; returns the undo."""
    from openrebench.harness import OpenRebenchSandbox

    saved = {}
    for name in ("exec", "score", "read_file", "write_file"):
        original = getattr(OpenRebenchSandbox, name)
        saved[name] = original

        def timed(*args: Any, __original: Any = original, **kwargs: Any) -> Any:
            async def run() -> Any:
                t0 = time.time()
                try:
                    return await __original(*args, **kwargs)
                finally:
                    spans.append((t0, time.time()))

            return run()

        setattr(OpenRebenchSandbox, name, timed)
    return lambda: [setattr(OpenRebenchSandbox, n, f) for n, f in saved.items()] and None


def _scripts() -> dict[str, list[Any]]:
    from inspect_ai.model import ModelOutput

    from openrebench.harness.agents import aide
    from openrebench.runs import get_environment

    start = (get_environment("optimize_kernel").root / "starting" / "solution.py").read_text()
    turns = [ModelOutput.for_tool_call("mockllm/model", "bash", {"command": f"echo step {i}"})
             for i in range(STEPS)]
    done = ModelOutput.for_tool_call("mockllm/model", "submit", {"answer": "done"})
    drafts = [ModelOutput.from_content("mockllm/model", f"Draft {i}: the plain version.\n\n```python "
                                       f"solution.py\n{start}```\n") for i in range(3)]
    nothing = [ModelOutput.from_content("mockllm/model", "I have nothing to add.")] * aide.FAILURES_IN_A_ROW
    return {"react": [*turns, done], "modular": [*turns, done], "aide": [*drafts, *nothing]}


def scaffold_steps(tmp: Path) -> dict[str, dict[str, Any]]:
    from inspect_ai import eval as inspect_eval
    from inspect_ai.model import get_model

    from openrebench.harness import environment_tasks

    out = {}
    for agent, outputs in _scripts().items():
        spans: list[tuple[float, float]] = []
        undo = _record_sandbox(spans)
        try:
            task = environment_tasks()["optimize_kernel"](tier="mini", agent=agent, time_limit=1800,
                                                          runs_dir=str(tmp / agent / "runs"))
            (log,) = inspect_eval(task, model=get_model("mockllm/model", custom_outputs=outputs),
                                  log_dir=str(tmp / agent / "logs"), display="none")
        finally:
            undo()
        if log.status != "success" or not log.samples:
            raise RuntimeError(f"the {agent} attempt failed: {log.error}")
        own = own_step_times(log, spans)
        p95 = statistics.quantiles(own, n=20, method="inclusive")[-1] if len(own) >= 2 else own[0]
        out[agent] = {"steps": len(own), "median_ms": statistics.median(own) * 1e3, "p95_ms": p95 * 1e3,
                      "max_ms": max(own) * 1e3, "own_ms": [round(x * 1e3, 2) for x in own]}
        print(f"{agent}: {len(own)} steps, median {out[agent]['median_ms']:.1f} ms", flush=True)
    return out


def serve_streaming_upstream() -> None:
    """A fake upstream whose streamed answer is STREAM_CHUNKS chunks, one every CHUNK_DELAY_S."""
    import asyncio

    from aiohttp import web

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        head = {"id": "chatcmpl-0", "object": "chat.completion.chunk", "created": 0, "model": "fake"}
        for i in range(STREAM_CHUNKS):
            delta = {"role": "assistant", "content": "word "} if i == 0 else {"content": "word "}
            chunk = {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await asyncio.sleep(CHUNK_DELAY_S)
        end = {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
               "usage": {"prompt_tokens": 12, "completion_tokens": STREAM_CHUNKS, "total_tokens": 52}}
        await response.write(f"data: {json.dumps(end)}\n\ndata: [DONE]\n\n".encode())
        await response.write_eof()
        return response

    serve_chat(chat)


def _one_stream(client: httpx.Client) -> tuple[float, float]:
    body = {"model": "task_model", "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "Say many words."}]}
    t0 = time.perf_counter()
    first = None
    with client.stream("POST", "/chat/completions", json=body) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if first is None and line.startswith("data: {") and '"content"' in line:
                first = time.perf_counter() - t0
    if first is None:
        raise RuntimeError("the stream carried no content")
    return first, time.perf_counter() - t0


def streaming(requests: int) -> dict[str, Any]:
    from openrebench.gateway import install_forwarder

    here, gateway_script = str(Path(__file__).resolve()), str(Path(__file__).with_name("gateway.py"))
    with tempfile.TemporaryDirectory() as tmp, process(here, "--serve-upstream") as up_port:
        upstream = f"http://127.0.0.1:{up_port}/v1"
        sock, usage = f"{tmp}/gateway.sock", f"{tmp}/usage.jsonl"
        with process(gateway_script, "--serve-gateway", sock, upstream, "fake", "", usage), \
                process(str(install_forwarder(Path(tmp))), sock, "0") as fwd:
            forwarded = f"http://127.0.0.1:{fwd.rsplit(':', 1)[1]}/v1"
            paths = {"direct": httpx.Client(base_url=upstream, trust_env=False),
                     "gateway (forwarder)": httpx.Client(base_url=forwarded, trust_env=False,
                                                         headers={"Authorization": f"Bearer {TOKEN}"})}
            times: dict[str, list[tuple[float, float]]] = {name: [] for name in paths}
            for i in range(requests + 5):
                for name, client in paths.items():  # interleaved
                    measured = _one_stream(client)
                    if i >= 5:
                        times[name].append(measured)
    out: dict[str, Any] = {}
    for name, values in times.items():
        out[name] = {"first_chunk_ms": statistics.median(v[0] for v in values) * 1e3,
                     "whole_ms": statistics.median(v[1] for v in values) * 1e3}
    pairs = zip(times["gateway (forwarder)"], times["direct"], strict=True)
    added = [(g[0] - d[0], g[1] - d[1]) for g, d in pairs]
    out["added_first_chunk_ms"] = statistics.median(a for a, _ in added) * 1e3
    out["added_whole_ms"] = statistics.median(b for _, b in added) * 1e3
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stream-requests", type=int, default=50, help="streamed requests per path")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from openrebench.runs import detect_hardware

    with tempfile.TemporaryDirectory() as tmp:
        steps = scaffold_steps(Path(tmp))
    streams = streaming(args.stream_requests)
    console = Console()
    table = Table(title="each scaffold's own time per step (outside model, tool and sandbox calls)")
    for column in ("scaffold", "steps", "median ms", "p95 ms", "max ms", "≤ 50 ms median"):
        table.add_column(column, justify="left" if column == "scaffold" else "right")
    for agent, r in steps.items():
        table.add_row(agent, str(r["steps"]), f"{r['median_ms']:.1f}", f"{r['p95_ms']:.1f}",
                      f"{r['max_ms']:.1f}", "yes" if r["median_ms"] <= 50 else "NO")
    console.print(table)
    table = Table(title=f"streamed chat completion ({STREAM_CHUNKS} chunks, {CHUNK_DELAY_S * 1e3:g} ms "
                        f"apart; {args.stream_requests} per path, interleaved; medians)")
    for column in ("path", "first chunk ms", "whole stream ms"):
        table.add_column(column, justify="left" if column == "path" else "right")
    for name in ("direct", "gateway (forwarder)"):
        table.add_row(name, f"{streams[name]['first_chunk_ms']:.2f}", f"{streams[name]['whole_ms']:.2f}")
    table.add_row("added by the gateway (paired)", f"{streams['added_first_chunk_ms']:.2f}",
                  f"{streams['added_whole_ms']:.2f}")
    console.print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {"command": " ".join(["python", *sys.argv]),
              "measured_at": datetime.now().isoformat(timespec="seconds"),
              "hardware": detect_hardware().model_dump(), "scaffolds": steps, "streaming": streams}
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"results: {args.out}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve-upstream"]:
        serve_streaming_upstream()
    else:
        main()
