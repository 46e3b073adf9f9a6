"""Prompt log-probabilities of the offline model: what OpenAI's completions API gives with `echo`.

A base model judges best by likelihood (how probable an answer is after a question, against how
probable it is anyway), and OpenAI's legacy completions API, vLLM and lm-eval-harness ask for that with
`echo=true, logprobs=0, max_tokens=0`: the prompt's own tokens with their log-probabilities. llama.cpp's
server gives log-probabilities of generated tokens only, and forcing an answer through it one token at
a time (a grammar or a logit bias) ran at 4 tokens/s on two cores. So echo requests to the offline
model are served here instead, by the same weights in PyTorch: the GGUF dequantised once by
transformers into a cached Hugging Face folder (stored in bfloat16; about 540 MB), computed in float32,
then forward passes of up to 8 prompts of similar length, sharing the rows their prefixes have in
common: about 100 tokens/s on two AMD EPYC cores, where a grammar through llama.cpp gave 4 (bfloat16
compute, emulated on CPUs without native bfloat16, ran at 26).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from openrebench.base import OpenRebenchError

HF_FOLDER = "gemma-3-270m-hf"
_BUILD_VERSION = "1"
MAX_TEXT_TOKENS = 1024  # per prompt: a judge's question and answer fit many times over
ECHO_BATCH = 8  # texts per forward pass, taken in order of length
LOGIT_ROWS = 256  # rows of the vocabulary's product at once: 256 MB of logits for Gemma's 262k tokens


def hf_model_dir(cache: Path | None = None) -> Path:
    """The offline model as a Hugging Face folder (safetensors, config, tokenizer), made once from the
    GGUF: needs `gguf` and `accelerate` the first time (transformers' GGUF reader)."""
    from ._local_file import _flock, local_model_path, models_dir

    folder = models_dir(cache) / HF_FOLDER
    done = folder / f".complete-{_BUILD_VERSION}"
    if done.exists():
        return folder
    gguf = local_model_path(cache)
    folder.mkdir(parents=True, exist_ok=True)
    with _flock(folder.with_name(f".{HF_FOLDER}.lock")):
        if done.exists():
            return folder
        _convert(gguf, folder)
        done.write_text("")
    return folder


@contextlib.contextmanager
def _gguf_read_once() -> Iterator[None]:
    """Parse a GGUF's metadata once however often transformers asks (for the tokenizer, the config, the
    weights: three or four times, about 20 s each on two cores for Gemma's 262k-token vocabulary, whose
    strings the `gguf` reader walks in Python). Readers are only read from, so one can serve every call."""
    import gguf as gguf_module

    real = gguf_module.GGUFReader
    readers: dict[tuple[str, str], Any] = {}

    def reader(path: Any, mode: str = "r") -> Any:
        key = (str(Path(path).resolve()), mode)
        if key not in readers:
            readers[key] = real(path, mode)
        return readers[key]

    gguf_module.GGUFReader = reader
    try:
        yield
    finally:
        gguf_module.GGUFReader = real


def _convert(gguf: Path, folder: Path) -> None:
    import torch
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        with _gguf_read_once():
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                         dtype=torch.bfloat16)
    except (ImportError, ValueError) as e:
        raise OpenRebenchError(f"cannot read {gguf.name} into PyTorch ({str(e).splitlines()[0][:200]}): "
                               "pip install gguf accelerate") from None
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are dequantised: a plain model from here on
    config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    save_model(model, str(folder / "model.safetensors"))


class Likelihood:
    """Log-probabilities of texts under the offline model, computed in batches, one call at a time
    (PyTorch uses every core for one forward pass; two at once would only share them)."""

    def __init__(self, folder: Path | None = None) -> None:
        self._folder = folder
        self._model: Any = None
        self._tokenizer: Any = None
        self._lock = threading.Lock()

    def _load(self) -> None:
        if self._model is not None:
            return
        import torch
        from safetensors.torch import load_model
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
        try:
            from transformers.initialization import no_init_weights
        except ImportError:  # a transformers without it: the weights are drawn, then replaced all the same
            no_init_weights = contextlib.nullcontext

        folder = self._folder or hf_model_dir()
        config = AutoConfig.from_pretrained(folder)
        # float32 compute: 3.7x faster than bfloat16 on a CPU without native bfloat16 (AVX2 only: 5.1 s
        # against 19.2 s for 16 answers), and the same numbers on every CPU. Built without drawing
        # random weights that the file's replace at once (Gemma 3 270M: 2.1 s instead of 4.4 to 6.7 s);
        # `load_model` is strict, so every parameter comes from the file.
        with no_init_weights():
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.tie_weights()  # as construction does when it initialises (the file holds one of the pair)
        load_model(model, str(folder / "model.safetensors"))
        self._model = model.eval()
        self._tokenizer = AutoTokenizer.from_pretrained(folder)

    def echo(self, texts: list[str]) -> list[dict[str, Any]]:
        """For each text, OpenAI's completions `logprobs` object for its own tokens: `tokens`,
        `token_logprobs`, `text_offset`, and no `top_logprobs`. The model's start-of-text token is put
        before each text (so even the first token has a log-probability) and is not listed.

        Texts are scored in batches of similar length (a judge's request mixes answers with and without
        their question: padding the short ones to the long ones' length cost a sixth of the transformer's
        time), and each distinct prefix's next-token probability is computed once per batch (candidates
        for one question share the question's rows; the vocabulary's product is most of the cost)."""
        with self._lock:
            self._load()
            tok = self._tokenizer
            encoded = [tok(t, add_special_tokens=False, return_offsets_mapping=True) for t in texts]
            for e in encoded:
                if len(e.input_ids) > MAX_TEXT_TOKENS:
                    raise ValueError(f"a prompt of {len(e.input_ids)} tokens is longer than the "
                                     f"{MAX_TEXT_TOKENS} the offline model's echo takes")
                if not e.input_ids:
                    raise ValueError("an empty prompt has no tokens to score")
            order = sorted(range(len(texts)), key=lambda i: len(encoded[i].input_ids))
            chosen: dict[int, list[float]] = {}
            for start in range(0, len(order), ECHO_BATCH):
                batch = order[start:start + ECHO_BATCH]
                scored = self._one_batch([encoded[i].input_ids for i in batch])
                chosen.update(zip(batch, scored, strict=True))
        out = []
        for i, (text, e) in enumerate(zip(texts, encoded, strict=True)):
            n = len(e.input_ids)
            offsets = [int(a) for a, _ in e.offset_mapping]
            pieces = [text[a:(offsets[k + 1] if k + 1 < n else len(text))] for k, a in enumerate(offsets)]
            out.append({"tokens": pieces, "token_logprobs": chosen[i], "top_logprobs": None,
                        "text_offset": offsets})
        return out

    def ready(self) -> bool:
        """Whether the weights are loaded, or load now: True, else the error. Without waiting on a request
        that holds the lock, since one that does has loaded them."""
        if self._model is not None:
            return True
        with self._lock:
            self._load()
        return True

    def unload(self) -> None:
        """Let the weights go (the next request loads them again)."""
        with self._lock:
            self._model = self._tokenizer = None

    def count(self, text: str) -> int:
        """Tokens of `text` (without the start token): what a request is metered by."""
        with self._lock:
            self._load()
            return len(self._tokenizer(text, add_special_tokens=False).input_ids)

    def _one_batch(self, texts: list[list[int]]) -> list[list[float]]:
        """Each token's log-probability after the tokens before it (the start token first)."""
        import torch

        bos = self._tokenizer.bos_token_id
        rows = [[bos, *ids] for ids in texts]
        width = max(len(r) for r in rows)
        pad = self._tokenizer.pad_token_id if self._tokenizer.pad_token_id is not None else 0
        ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        # Row k of a text predicts its token k + 1 from its tokens up to k: texts that begin alike share
        # those rows. Each distinct (prefix, next token) is scored once: a prefix is named by the slot of
        # the prefix one token shorter and its last token (the start token alone: -1).
        where: dict[tuple[int, int], int] = {}
        picks: list[tuple[int, int]] = []
        slots = []
        for i, r in enumerate(rows):
            row_slots, previous = [], -1
            for k in range(len(r) - 1):
                previous = where.setdefault((previous, r[k + 1]), len(where))
                if previous == len(picks):
                    picks.append((i, k))
                row_slots.append(previous)
            slots.append(row_slots)
        with torch.inference_mode():
            hidden = self._model.model(input_ids=ids, attention_mask=mask).last_hidden_state
            at = torch.tensor(picks)
            targets = torch.tensor([rows[i][k + 1] for i, k in picks])
            values = []
            # The vocabulary's product a block of rows at a time: 8 prompts of 1024 tokens at once would
            # hold 8.6 GB of logits (and as much again for the loss), in the harness's own memory, where
            # no run's limit applies. Fused: a separate log-softmax over the 262k-token vocabulary took 20x
            # longer (2 GB written for a batch).
            for first in range(0, len(picks), LOGIT_ROWS):
                block = at[first:first + LOGIT_ROWS]
                logits = self._model.lm_head(hidden[block[:, 0], block[:, 1]])
                values += (-torch.nn.functional.cross_entropy(logits, targets[first:first + LOGIT_ROWS],
                                                               reduction="none").float()).tolist()
        return [[values[slot] for slot in row_slots] for row_slots in slots]


# Chat parameters llama.cpp takes and drops with the offline model (its template has no tool format, it
# does not reason, it reads text only): refused, so that a client learns it was not served as asked.
NO_TOOLS = "its chat template has no tool format (use a hosted or vLLM model for tool calls)"
IGNORED_BY_LOCAL = {"tools": NO_TOOLS, "functions": NO_TOOLS, "parallel_tool_calls": NO_TOOLS,
                    "reasoning_effort": "it is not a reasoning model",
                    "verbosity": "it is not a reasoning model", "audio": "it reads and writes text only",
                    "prediction": "llama.cpp takes no predicted output",
                    "web_search_options": "it has no web search"}


class LocalModelBackend:
    """The offline model's backend: llama.cpp's server for everything but `echo` completions, which the
    PyTorch copy scores (`Likelihood`). Only `max_tokens: 0` is taken with `echo` (the prompt alone).
    Streams as llama.cpp does, a token an event (an echo comes whole); takes at most `max_choices`
    choices a request (`n`: the server's slots)."""

    def __init__(self, upstream: Any, likelihood: Likelihood) -> None:
        self.upstream, self.likelihood = upstream, likelihood
        self.name = upstream.name
        self.capacity = upstream.capacity
        self.max_choices = upstream.capacity  # llama.cpp refuses `n` past its slots
        self.usage_counts_one_choice = upstream.usage_counts_one_choice

    def check(self, kind: str, body: dict[str, Any]) -> None:
        """Refuse what llama.cpp would take and drop (tools above all: the base model cannot call them)."""
        from ._backends import Unsupported

        if kind != "chat":
            return
        asked = [k for k in IGNORED_BY_LOCAL if body.get(k) not in (None, [], False)]
        for key in ("tool_choice", "function_call"):
            if body.get(key) not in (None, "none", "auto"):
                asked.append(key)
        if body.get("modalities") not in (None, ["text"]):
            asked.append("modalities")
        messages = body.get("messages") if isinstance(body.get("messages"), list) else []
        if any(isinstance(m, dict) and (m.get("tool_calls") or m.get("role") in ("tool", "function"))
               for m in messages):
            asked.append("tool calls in messages")
        if asked:
            why = IGNORED_BY_LOCAL.get(asked[0], NO_TOOLS)
            raise Unsupported(f"the offline model ({self.name}) does not take {', '.join(asked)}: {why}")

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            return await self.upstream.chat(body)
        except Exception as e:
            raise await self.classified(e) from None

    async def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        if not body.get("echo"):
            try:
                return await self.upstream.complete(body)
            except Exception as e:
                raise await self.classified(e) from None
        return await self._echo(body)

    async def stream(self, kind: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        if kind == "completions" and body.get("echo"):
            from ._streaming import whole_as_chunks

            for chunk in whole_as_chunks(await self._echo(body), kind):
                yield chunk
            return
        started = False
        try:
            async for chunk in self.upstream.stream(kind, body):
                started = True
                yield chunk
        except Exception as e:
            if started:
                raise
            raise await self.classified(e) from None

    async def classified(self, error: Exception) -> Exception:
        """llama.cpp answers some requests that are the client's own fault with a 500 that quotes them (an
        unknown `reasoning_format`, message content of the wrong type): while its server stays healthy,
        such a failure is the request's (a 400 to the client), not the harness's. Otherwise a scoring's
        code could make its scoring an infrastructure failure at will, one bit it chooses after reading
        held-out data. A server that is down, or does not answer its health check, stays the harness's."""
        from ._backends import BackendError, BackendUnavailable, BadRequest

        healthy = getattr(self.upstream, "healthy", None)
        if (not isinstance(error, BackendError) or isinstance(error, BackendUnavailable) or error.status < 500
                or healthy is None or not await healthy()):
            return error
        return BadRequest(f"the offline model's server could not serve this request: {error.message}")

    async def aclose(self) -> None:
        await self.upstream.aclose()

    async def _echo(self, body: dict[str, Any]) -> dict[str, Any]:
        import asyncio
        import time
        import uuid

        from ._backends import BadRequest, Unsupported

        if body.get("max_tokens") != 0:
            raise Unsupported("the offline model echoes a prompt's log-probabilities with max_tokens 0 only "
                              "(generate without echo)")
        prompt = body.get("prompt")
        prompts = [prompt] if isinstance(prompt, str) else prompt
        if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
            raise BadRequest("'prompt' must be a string or a non-empty list of strings")
        try:
            scored = await asyncio.to_thread(self.likelihood.echo, prompts)
        except ValueError as e:
            raise BadRequest(str(e)) from None
        want = body.get("logprobs") is not None
        choices = [{"index": i, "text": p, "logprobs": s if want else None, "finish_reason": "length"}
                   for i, (p, s) in enumerate(zip(prompts, scored, strict=True))]
        tokens = sum(len(s["tokens"]) for s in scored)
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": self.name, "choices": choices,
                "usage": {"prompt_tokens": tokens, "completion_tokens": 0, "total_tokens": tokens}}
