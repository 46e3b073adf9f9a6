"""A hosted model's path without the internet: a local OpenAI-compatible server stands in for the
provider (`--model openai/...` with `-M base_url=`), and the react agent, driven by its script, reaches a
valid score above the start through a real mini environment and its sandbox. The provider's key is in
the harness's environment only: the sandbox's environment, its processes' and its files never show it.
The provider refuses the first requests with rate limits: they are retried, and the waiting is not
charged to the attempt's working time (as in the paper)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from kernel_support import write_reference_code
from openrebench.isolation import bwrap_binary

pytest.importorskip("openai")

RATE_LIMITED = 2  # the first requests refused with a 429
RETRY_AFTER_S = 2
# Every file a leak could have put the key in: those written since the key was made (the search of the
# whole tree read gigabytes of the Python environment, written long before the key existed). A control
# file holding the piece of the key shows that the search finds what is there.
LOOK_FOR_KEY = ("env; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c '^OPENAI_API_KEY=' ; "
                "echo \"$PROBE\" > /tmp/control-probe; "
                "find / \\( -path /proc -o -path /sys \\) -prune -o -type f -newermt @$SINCE -print0 "
                "2>/dev/null | xargs -0 -r grep -Il \"$PROBE\" 2>/dev/null | head -5; echo searched")


class _Provider(BaseHTTPRequestHandler):
    """/v1/chat/completions: rate limits first, then the script by the number of tool results so far:
    look for the key, write the reference solution, score, then only talk (the agent stops when idle)."""

    requests: ClassVar[list[dict[str, Any]]] = []  # each: time, authorization, body
    probe: ClassVar[str] = ""
    since: ClassVar[int] = 0  # when the key was made (a second before, for the clock's granularity)

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        seen = {"at": time.monotonic(), "authorization": self.headers.get("Authorization"), "body": body}
        type(self).requests.append(seen)
        if len(self.requests) <= RATE_LIMITED:
            error = {"error": {"message": "Rate limit reached for requests", "type": "requests",
                               "code": "rate_limit_exceeded"}}
            self._send(429, json.dumps(error).encode(), {"retry-after": str(RETRY_AFTER_S)})
            return
        done = sum(m["role"] == "tool" for m in body["messages"])
        look = LOOK_FOR_KEY.replace("$PROBE", self.probe).replace("$SINCE", str(self.since))
        script = [("bash", {"command": look}),
                  ("python", {"code": write_reference_code("example_fit")}),
                  ("score", {})]
        message: dict[str, Any] = {"role": "assistant", "content": "Done: the reference solution is in."}
        finish = "stop"
        if done < len(script):
            name, arguments = script[done]
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{done}", "type": "function",
                 "function": {"name": name, "arguments": json.dumps(arguments)}}]}
            finish = "tool_calls"
        reply = {"id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion", "created": 0,
                 "model": body["model"],
                 "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                 "usage": {"prompt_tokens": 500, "completion_tokens": 20, "total_tokens": 520}}
        self._send(200, json.dumps(reply).encode())

    def _send(self, status: int, data: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def provider() -> Iterator[str]:
    _Provider.requests = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Provider)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()


@pytest.mark.slow
@pytest.mark.skipif(bwrap_binary() is None, reason="needs bubblewrap: the key's absence is the sandbox's")
def test_a_react_attempt_through_a_stand_in_provider_scores_with_the_key_out_of_the_sandbox(
        tmp_path: Path, provider: str) -> None:
    _Provider.since = int(time.time()) - 1
    key = f"sk-stand-in-{secrets.token_hex(12)}"
    _Provider.probe = key[-16:]  # a piece of the key: what a search of the sandbox's files looks for
    env = {**os.environ, "OPENAI_API_KEY": key, "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}
    env.pop("OPENAI_BASE_URL", None)
    logs, runs = tmp_path / "logs", tmp_path / "runs"
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "openrebench"), "eval", "example_fit", "--agent", "react",
         "--model", "openai/stand-in", "-M", f"base_url={provider}", "-M", "responses_api=false",
         "--max-retries", "4", "--timeout", "60", "--time-limit", "10m", "--display", "none",
         "--log-dir", str(logs), "--runs-dir", str(runs)],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]

    requests = _Provider.requests
    assert all(r["authorization"] == f"Bearer {key}" for r in requests)  # the key was the provider's
    results = [m for m in requests[-1]["body"]["messages"] if m["role"] == "tool"]
    assert len(results) >= 3
    looked = str(results[0]["content"])
    assert "\nPATH=" in looked and "OPENAI" not in looked  # the sandbox's environment, without the key
    # no process had it; no file held a piece of it but the control
    assert looked.rstrip().endswith("\n0\n/tmp/control-probe\nsearched"), looked[-500:]
    assert key not in json.dumps([r["body"] for r in requests])

    from inspect_ai.log import list_eval_logs, read_eval_log

    (info,) = list_eval_logs(str(logs))
    (sample,) = read_eval_log(info).samples or []
    assert sample.scores and next(iter(sample.scores.values())).value not in (None, 0)
    rows = [json.loads(line) for line in next(runs.rglob("score_log.jsonl")).read_text().splitlines()]
    agents = [r["normalised"] for r in rows if r["kind"] == "score" and r["normalised"] is not None]
    assert agents and max(agents) > 0.5, rows  # well above the start (0), near the reference (1)

    waited = requests[RATE_LIMITED]["at"] - requests[0]["at"]  # the provider's refusals, retried
    assert waited >= RETRY_AFTER_S * 0.9
    assert sample.total_time is not None and sample.working_time is not None
    assert sample.total_time - sample.working_time >= waited * 0.8, (sample.total_time, sample.working_time)
