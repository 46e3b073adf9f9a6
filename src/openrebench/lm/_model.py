"""A GPT in the style of nanoGPT: pre-norm blocks, learned positions, tied input and output embeddings.

Parameter names follow GPT-2's (`transformer.wte`, `transformer.h.0.attn.c_attn`, ...), so Hugging Face
GPT-2 weights load with a transpose of the Conv1D matrices (`GPT.from_pretrained`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import BaseModel, Field, model_validator
from torch import nn


class GPTConfig(BaseModel):
    """The shape of a GPT; persisted with every checkpoint."""

    block_size: int = Field(1024, gt=0, description="Longest context (number of learned positions).")
    vocab_size: int = Field(50304, gt=0, description="GPT-2's 50257 padded to a multiple of 64.")
    n_layer: int = Field(12, gt=0)
    n_head: int = Field(12, gt=0)
    n_embd: int = Field(768, gt=0)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    bias: bool = True

    @model_validator(mode="after")
    def _heads_divide_width(self) -> GPTConfig:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})")
        return self


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head, self.dropout = config.n_head, config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c)))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict({
            "wte": nn.Embedding(config.vocab_size, config.n_embd),
            "wpe": nn.Embedding(config.block_size, config.n_embd),
            "drop": nn.Dropout(config.dropout),
            "h": nn.ModuleList(Block(config) for _ in range(config.n_layer)),
            "ln_f": nn.LayerNorm(config.n_embd, bias=config.bias),
        })
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied: one matrix reads and writes tokens
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2: scale residual projections by depth
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; by default without the position embeddings (the token ones are shared with
        the output layer and count), as in the scaling-law literature."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.transformer.wpe.weight.numel() if non_embedding else n

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits for every position, and the mean cross-entropy against `targets` (-1 = ignored)."""
        t = idx.size(1)
        if t > self.config.block_size:
            raise ValueError(f"sequence of length {t} is longer than block_size {self.config.block_size}")
        pos = torch.arange(t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    def configure_optimizer(self, weight_decay: float, learning_rate: float, betas: tuple[float, float],
                            device_type: str) -> torch.optim.AdamW:
        """AdamW with weight decay on matrices only (not on biases or LayerNorm gains)."""
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        extra: dict[str, Any] = {"fused": True} if device_type == "cuda" else {}
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, **extra)

    def flops_per_token(self) -> int:
        """Training FLOPs per token (forward + backward): 6N plus attention, as in PaLM's appendix B."""
        c = self.config
        return 6 * self.num_params() + 12 * c.n_layer * c.n_embd * c.block_size

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
        """Sample a continuation of `idx` (batch, time), one token at a time."""
        for _ in range(max_new_tokens):
            context = idx[:, -self.config.block_size:]
            logits = self(context)[0][:, -1, :] / max(temperature, 1e-8)
            if top_k is not None:
                kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            probs = F.softmax(logits, dim=-1)
            idx = torch.cat([idx, torch.multinomial(probs, 1, generator=generator)], dim=1)
        return idx

    @classmethod
    def from_hf_state_dict(cls, state: dict[str, torch.Tensor], config: GPTConfig) -> GPT:
        """A GPT from a Hugging Face GPT2LMHeadModel state dict (Conv1D weights are stored transposed)."""
        model = cls(config)
        ours = model.state_dict()
        transposed = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
        loaded = {"lm_head.weight"}  # tied to wte
        for name, value in state.items():
            if name.endswith((".attn.bias", ".attn.masked_bias")) or name == "lm_head.weight":
                continue  # causal-mask buffers of older versions; the head is tied to wte
            if name not in ours:
                raise KeyError(f"unexpected weight {name} in the Hugging Face state dict")
            ours[name].copy_(value.t() if name.endswith(transposed) else value)
            loaded.add(name)
        if missing := sorted(set(ours) - loaded):
            raise KeyError(f"the Hugging Face state dict lacks {', '.join(missing[:3])}")
        return model

    def to_hf(self) -> Any:
        """This model as a Hugging Face GPT2LMHeadModel (the same weights, names and tanh GELU; Conv1D
        weights transposed), for code written against transformers."""
        from transformers import GPT2Config, GPT2LMHeadModel  # type: ignore[import-not-found]

        c = self.config
        if not c.bias:
            raise ValueError("a Hugging Face GPT-2 has biases: only a GPT with bias=True converts")
        hf = GPT2LMHeadModel(GPT2Config(vocab_size=c.vocab_size, n_positions=c.block_size, n_embd=c.n_embd,
                                        n_layer=c.n_layer, n_head=c.n_head, activation_function="gelu_new",
                                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                        bos_token_id=c.vocab_size - 1, eos_token_id=c.vocab_size - 1))
        transposed = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
        state = {k: (v.t() if k.endswith(transposed) else v).clone() for k, v in self.state_dict().items()
                 if k != "lm_head.weight"}
        missing, unexpected = hf.load_state_dict(state, strict=False)
        if unexpected or set(missing) - {"lm_head.weight"}:
            raise KeyError(f"GPT -> GPT2LMHeadModel: missing {missing[:3]}, unexpected {unexpected[:3]}")
        hf.tie_weights()
        return hf.eval()

    @classmethod
    def from_pretrained(cls, name: str = "gpt2", **overrides: Any) -> GPT:
        """OpenAI's GPT-2 weights (gpt2, gpt2-medium, gpt2-large, gpt2-xl) through `transformers`."""
        from transformers import GPT2LMHeadModel  # type: ignore[import-not-found]

        hf = GPT2LMHeadModel.from_pretrained(name)
        c = hf.config
        config = GPTConfig(block_size=c.n_positions, vocab_size=c.vocab_size, n_layer=c.n_layer,
                           n_head=c.n_head, n_embd=c.n_embd, bias=True, **overrides)
        return cls.from_hf_state_dict(hf.state_dict(), config)
