"""The model gateway's cost per request: latency it adds, and throughput with many clients at once.

Three processes besides this one, as in a run: a fake OpenAI-compatible upstream that answers at once
(or `--upstream URL`, a real server), the gateway (an `OpenAICompatibleBackend` to the upstream, its
Unix socket and a 127.0.0.1 port), and the sandbox's forwarder (`gateway-forward`, TCP to the socket).
The client here posts the same small chat request over each path, interleaved, sequentially:
- direct: straight to the upstream;
- unix socket: to the gateway's socket (what a client given the socket uses);
- forwarder: to the forwarder's port (what an unmodified client in the sandbox uses);
- gateway tcp: to the gateway's own port (clients outside sandboxes).
It reports the median and p95 of each, the median of the paired differences against direct (the
added latency; the issue's target is under 5 ms), and requests/s with 32 concurrent clients.

    .venv/bin/python benchmarks/gateway.py --out benchmarks/results/gateway/$(date +%F)_xeon.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import httpx
from rich.console import Console
from rich.table import Table

from openrebench.gateway import install_forwarder
from openrebench.runs import detect_hardware

TOKEN = "benchmark-token"
REQUEST = {"model": "task_model", "max_tokens": 8, "messages": [{"role": "user", "content": "Say hi."}]}
ANSWER = {"id": "chatcmpl-0", "object": "chat.completion", "created": 0, "model": "fake",
          "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                       "finish_reason": "stop"}],
          "usage": {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13}}


def serve_chat(chat: Any) -> None:
    """Serve `chat` (an aiohttp handler) as /v1/chat/completions on a free port of 127.0.0.1, saying
    `ready PORT` once it listens; for ever."""
    from aiohttp import web

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        print(f"ready {runner.addresses[0][1]}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


def serve_upstream() -> None:
    """The fake upstream: every chat request answered at once with the same small completion."""
    from aiohttp import web

    async def chat(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response(ANSWER)

    serve_chat(chat)


def serve_gateway(sock: str, upstream: str, model: str, api_key: str | None, usage: str) -> None:
    from openrebench.gateway import Gateway, OpenAICompatibleBackend, RoleModel

    async def main() -> None:
        async with Gateway(Path(sock), tcp_port=0, concurrency=64) as gw:
            gw.grant(TOKEN, roles={"task_model": RoleModel(OpenAICompatibleBackend(upstream, model, api_key),
                                                           "local/fake", price={"input": 0, "output": 0})},
                     usage_path=Path(usage))
            print(f"ready {gw.tcp_port}", flush=True)
            await asyncio.Event().wait()

    asyncio.run(main())


@contextmanager
def process(*args: str) -> Iterator[str]:
    """A child process of this benchmark, and what it printed after `ready` once it serves."""
    proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if not line.startswith(("ready", "listening")):
            raise RuntimeError(f"{args[0]} did not start: {line!r}")
        yield line.split()[-1]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@contextmanager
def upstream_server(url: str | None) -> Iterator[str]:
    """The real upstream's URL as given, else the fake one's, started here."""
    if url:
        yield url
        return
    with process(str(Path(__file__).resolve()), "--serve-upstream") as port:
        yield f"http://127.0.0.1:{port}/v1"


def clients(paths: dict[str, tuple[str, httpx.BaseTransport | None]], headers: dict[str, dict[str, str]]
            ) -> dict[str, httpx.Client]:
    return {name: httpx.Client(base_url=url, transport=transport, headers=headers[name], trust_env=False)
            for name, (url, transport) in paths.items()}


def sequential(paths: dict[str, httpx.Client], requests: int, warmup: int = 20) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in paths}
    for i in range(warmup + requests):
        for name, client in paths.items():  # interleaved: drifts of the machine fall on every path alike
            t0 = time.perf_counter()
            reply = client.post("/chat/completions", json=REQUEST)
            elapsed = time.perf_counter() - t0
            reply.raise_for_status()
            if i >= warmup:
                times[name].append(elapsed)
    return times


async def throughput(url: str, sock: str | None, headers: dict[str, str], concurrency: int,
                     requests: int) -> float:
    # aiohttp's client here: httpx's async client tops out near 200 requests/s on this machine, below
    # what the gateway serves, and would measure itself.
    connector = (aiohttp.UnixConnector(sock, limit=concurrency) if sock else
                 aiohttp.TCPConnector(limit=concurrency))
    async with aiohttp.ClientSession(connector=connector, headers=headers) as client:
        left = list(range(2 * concurrency))  # first, open and warm every connection

        async def worker() -> None:
            while left:
                left.pop()
                async with client.post(f"{url}/chat/completions", json=REQUEST) as reply:
                    reply.raise_for_status()
                    await reply.read()

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        left.extend(range(requests))
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return requests / (time.perf_counter() - t0)


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=300, help="sequential requests per path")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--throughput-requests", type=int, default=1000)
    parser.add_argument("--upstream", help="a real OpenAI-compatible server (its /v1 URL), not the fake")
    parser.add_argument("--model", default="fake", help="the upstream's model name")
    parser.add_argument("--api-key", help="the upstream's key, if it needs one")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    here = str(Path(__file__).resolve())
    with tempfile.TemporaryDirectory() as tmp, upstream_server(args.upstream) as upstream:
        sock, usage = f"{tmp}/gateway.sock", f"{tmp}/usage.jsonl"
        gateway = (here, "--serve-gateway", sock, upstream, args.model, args.api_key or "", usage)
        with process(*gateway) as gw_port, process(str(install_forwarder(Path(tmp))), sock, "0") as fwd:
            fwd_port = fwd.rsplit(":", 1)[1]
            gw_auth = {"Authorization": f"Bearer {TOKEN}"}
            up_auth = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
            paths = {"direct": (upstream, None),
                     "unix socket": ("http://gateway/v1", httpx.HTTPTransport(uds=sock)),
                     "forwarder": (f"http://127.0.0.1:{fwd_port}/v1", None),
                     "gateway tcp": (f"http://127.0.0.1:{gw_port}/v1", None)}
            headers = {name: up_auth if name == "direct" else gw_auth for name in paths}
            times = sequential(clients(paths, headers), args.requests)
            rps = {}
            for name, (url, _) in paths.items():
                via = sock if name == "unix socket" else None
                rps[name] = asyncio.run(throughput(url, via, headers[name], args.concurrency,
                                                   args.throughput_requests))
        rows = [json.loads(line) for line in Path(usage).read_text().splitlines()]
    median = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    tail = {k: p95(v) * 1e3 for k, v in times.items()}
    added = {k: statistics.median(a - d for a, d in zip(v, times["direct"], strict=True)) * 1e3
             for k, v in times.items() if k != "direct"}
    table = Table(title=f"gateway overhead ({args.requests} sequential requests per path, interleaved; "
                        f"{args.concurrency} concurrent clients for throughput)")
    for column in ("path", "median ms", "p95 ms", "added ms (paired median)", "requests/s"):
        table.add_column(column, justify="left" if column == "path" else "right")
    for name in paths:
        table.add_row(name, f"{median[name]:.2f}", f"{tail[name]:.2f}",
                      "" if name == "direct" else f"{added[name]:.2f}", f"{rps[name]:.0f}")
    Console().print(table)
    counted = sum(r["status"] == 200 for r in rows)
    print(f"usage rows written by the gateway: {len(rows)} ({counted} answered)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "command": " ".join(["python", *sys.argv]), "requests": args.requests,
        "concurrency": args.concurrency, "throughput_requests": args.throughput_requests,
        "upstream": args.upstream or "fake (aiohttp, answers at once)",
        "hardware": detect_hardware().model_dump(), "median_ms": median, "p95_ms": tail,
        "added_median_ms": added, "requests_per_s": rps, "usage_rows": len(rows),
        "seconds": times}, indent=2) + "\n")
    print(f"results: {args.out}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve-upstream"]:
        serve_upstream()
    elif sys.argv[1:2] == ["--serve-gateway"]:
        sock_, upstream_, model_, key_, usage_ = sys.argv[2:7]
        serve_gateway(sock_, upstream_, model_, key_ or None, usage_)
    else:
        main()
