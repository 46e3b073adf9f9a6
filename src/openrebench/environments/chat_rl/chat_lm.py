"""The chat model's plumbing: its tokenizer, loading and saving it, sampling answers, finetuning on
(instruction, response) pairs.

Shared: the workspace has a copy (`chat_lm.py`) for the agent's scripts, and the scorer samples the
submitted model's answers with its own copy, so what an agent measures with `generate` is what the
scorer does. It imports only the standard library, PyTorch, transformers, tokenizers and safetensors.

The model is a Hugging Face `GPT2LMHeadModel`. On the full tier its vocabulary is GPT-2's; on the mini
tier a compact one (GPT-2's most frequent tokens of the base model's training text, then UNK), which
`ChatTokenizer` maps to and from GPT-2's ids (`compact.json`).
"""

from __future__ import annotations

import contextlib
import json
import math
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

PROMPT = (
    "Below is an instruction that describes a task. Write a response that appropriately completes "
    "the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n"
)
"""The Alpaca format, as in the paper: an instruction in, a response out."""

WEIGHTS = "model.safetensors"
CONFIG = "config.json"


def prompt_for(instruction: str) -> str:
    return PROMPT.format(instruction=instruction.strip())


class ChatTokenizer:
    """GPT-2's BPE (`tokenizer.json`), with the compact vocabulary's mapping (`compact.json`) where the
    folder has one. `eos_id` ends an answer; UNK (compact only) decodes to nothing."""

    def __init__(self, folder: Path | str) -> None:
        from tokenizers import Tokenizer

        folder = Path(folder)
        self._bpe = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.gpt2_eos = 50256
        compact = folder / "compact.json"
        if compact.is_file():
            table = json.loads(compact.read_text())
            self._to_gpt2: list[int] | None = [int(i) for i in table["gpt2_ids"]]
            self.unk_id: int | None = int(table["unk"])
            self._from_gpt2 = {g: i for i, g in enumerate(self._to_gpt2)}
            self.vocab_size = self.unk_id + 1
            self.eos_id = self._from_gpt2[self.gpt2_eos]
        else:
            self._to_gpt2 = self.unk_id = None
            self._from_gpt2 = {}
            self.vocab_size = self._bpe.get_vocab_size()
            self.eos_id = self.gpt2_eos

    def encode(self, text: str) -> list[int]:
        ids = self._bpe.encode(text, add_special_tokens=False).ids
        if self._to_gpt2 is None:
            return ids
        return [self._from_gpt2.get(i, self.unk_id) for i in ids]  # type: ignore[misc]

    def decode(self, ids: Sequence[int]) -> str:
        if self._to_gpt2 is not None:
            ids = [self._to_gpt2[i] for i in ids if 0 <= i < len(self._to_gpt2)]
        return self._bpe.decode([i for i in ids if i != self.gpt2_eos])


def load_model(folder: Path | str, device: str = "cpu") -> Any:
    """The model saved in `folder` by `save_model` (safetensors only: nothing in the folder runs)."""
    from safetensors.torch import load_file
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = Path(folder)
    config = GPT2Config.from_dict(json.loads((folder / CONFIG).read_text()))
    model = GPT2LMHeadModel(config)
    state = load_file(str(folder / WEIGHTS))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:  # the output layer is tied to the embedding
        raise ValueError(
            f"{folder / WEIGHTS} does not fit {CONFIG}: missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]}"
        )
    model.tie_weights()
    return model.to(device).eval()


def save_model(model: Any, folder: Path | str) -> None:
    """The weights as safetensors (the output layer is the embedding's, so it is not written twice)
    and the config as JSON: what the scorer reads."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG).write_text(json.dumps(model.config.to_dict(), indent=1, default=str) + "\n")
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(folder / WEIGHTS))


SMALL = 20_000_000  # parameters: on a CPU, a model this small runs its ops on one thread


@contextlib.contextmanager
def cpu_threads(model: Any, threads: int | None = None) -> Iterator[None]:
    """One math thread for a small model on a CPU, unless `threads` says otherwise: its ops are too small
    to split, and on cores that other work shares, waiting for a second thread made a finetuning step of
    the mini model 10x slower (2.4 s against 0.2 s) and sampling 75x slower. On cores nothing else uses,
    two threads finetune the mini model in 6.2 s for 50 steps against 10.6 s on one."""
    small = sum(p.numel() for p in model.parameters()) < SMALL
    if next(model.parameters()).device.type != "cpu" or not (small or threads):
        yield
        return
    with math_threads(threads or 1):
        yield


@contextlib.contextmanager
def math_threads(n: int) -> Iterator[None]:
    """PyTorch's CPU math threads set to `n` for the block, then set back."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _context(model: Any) -> int:
    return int(model.config.n_positions)


@torch.no_grad()
def _generate(
    model: Any,
    tokenizer: ChatTokenizer,
    instructions: Sequence[str],
    *,
    max_new_tokens: int,
    temperature: float = 0.7,
    top_k: int | None = 50,
    seed: int = 0,
    batch_size: int = 64,
) -> list[str]:
    """One sampled answer per instruction (in the Alpaca format), up to `max_new_tokens` or the end
    token; the same seed and batch size give the same answers. Prompts longer than the context are cut
    from the left."""
    device = next(model.parameters()).device
    generator = torch.Generator(device="cpu").manual_seed(seed)
    limit = _context(model) - max_new_tokens
    if limit < 8:
        raise ValueError(
            f"max_new_tokens {max_new_tokens} leaves no room for a prompt in a context of {_context(model)}"
        )
    answers: list[str] = []
    was_training = model.training
    model.eval()
    for start in range(0, len(instructions), batch_size):
        prompts = [tokenizer.encode(prompt_for(x))[-limit:] for x in instructions[start : start + batch_size]]
        width = max(len(p) for p in prompts)
        # Left-padded, so every row's next token is at the end; padding is masked out of attention.
        ids = torch.tensor([[tokenizer.eos_id] * (width - len(p)) + p for p in prompts], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        done = torch.zeros(len(prompts), dtype=torch.bool, device=device)
        out: list[list[int]] = [[] for _ in prompts]
        past = None
        step_ids = ids
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        step_positions = positions
        for _ in range(max_new_tokens):
            result = model(
                input_ids=step_ids,
                attention_mask=mask,
                position_ids=step_positions,
                past_key_values=past,
                use_cache=True,
            )
            past = result.past_key_values
            logits = result.logits[:, -1, :].float()
            if temperature <= 0:
                nxt = logits.argmax(-1)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                probs = torch.softmax(logits, -1).cpu()
                nxt = torch.multinomial(probs, 1, generator=generator).squeeze(-1).to(device)
            for i, token in enumerate(nxt.tolist()):
                if not done[i]:
                    if token == tokenizer.eos_id:
                        done[i] = True
                    else:
                        out[i].append(token)
            if bool(done.all()):
                break
            step_ids = nxt.unsqueeze(-1)
            mask = torch.cat([mask, torch.ones_like(step_ids)], dim=1)
            step_positions = step_positions[:, -1:] + 1
        answers += [clean_answer(tokenizer.decode(o)) for o in out]
    model.train(was_training)
    return answers


def clean_answer(text: str) -> str:
    """An answer as it is judged: its first paragraph, spaces collapsed (a model that goes on into a
    new "### Instruction" is cut there)."""
    text = text.split("###")[0].split("\n\n")[0]
    return " ".join(text.split())


def _finetune(
    model: Any,
    tokenizer: ChatTokenizer,
    examples: Sequence[tuple[str, str]],
    *,
    steps: int,
    batch_size: int = 16,
    learning_rate: float = 3e-4,
    mask_prompt: bool = True,
    seed: int = 0,
    weight_decay: float = 0.0,
) -> list[float]:
    """Supervised finetuning on (instruction, response) pairs, each prompt in the Alpaca format and its
    response ended by the end token; with `mask_prompt`, the loss counts response tokens only. Returns
    the loss of each step. Cosine learning rate, AdamW, `steps` batches drawn with `seed`."""
    if not examples:
        return []
    device = next(model.parameters()).device
    context = _context(model)
    rows = []
    for instruction, response in examples:
        p = tokenizer.encode(prompt_for(instruction))
        r = [*tokenizer.encode(" ".join(response.split())), tokenizer.eos_id]
        ids = (p + r)[-context:]
        n_prompt = max(0, len(ids) - len(r))
        labels = [-100] * n_prompt + ids[n_prompt:] if mask_prompt else list(ids)
        rows.append((ids, labels))
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(
        [q for q in model.parameters() if q.requires_grad], lr=learning_rate, weight_decay=weight_decay
    )
    model.train()
    losses = []
    for step in range(steps):
        batch = [rows[rng.randrange(len(rows))] for _ in range(batch_size)]
        width = max(len(ids) for ids, _ in batch)
        ids = torch.tensor([x + [tokenizer.eos_id] * (width - len(x)) for x, _ in batch], device=device)
        labels = torch.tensor([y + [-100] * (width - len(y)) for _, y in batch], device=device)
        mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x, _ in batch], device=device)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate * 0.5 * (1 + math.cos(math.pi * step / max(1, steps)))
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


def read_jsonl(path: Path | str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def generate(model: Any, tokenizer: ChatTokenizer, instructions: Sequence[str], **settings: Any) -> list[str]:
    """One sampled answer per instruction (in the Alpaca format), up to `max_new_tokens` or the end token:
    keyword arguments `max_new_tokens`, `temperature` (0.7; 0 is greedy), `top_k` (50), `seed` (0),
    `batch_size` (64). The same seed and batch size give the same answers; prompts longer than the
    context are cut from the left."""
    with cpu_threads(model):
        return _generate(model, tokenizer, instructions, **settings)


def finetune(
    model: Any, tokenizer: ChatTokenizer, examples: Sequence[tuple[str, str]], *, threads: int | None = None,
    **settings: Any,
) -> list[float]:
    """Supervised finetuning on (instruction, response) pairs (see `_finetune` for the settings: `steps`,
    `batch_size`, `learning_rate`, `mask_prompt`, `seed`, `weight_decay`); the loss of each step.
    `threads`: CPU math threads (default: see `cpu_threads`)."""
    with cpu_threads(model, threads):
        return _finetune(model, tokenizer, examples, **settings)
