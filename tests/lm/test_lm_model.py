"""The GPT, its training loop, evaluation, checkpoints and trained-model assets (all on CPU, tiny sizes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from openrebench.lm import (
    GPT,
    BuildIncomplete,
    Corpus,
    GPTConfig,
    TrainConfig,
    batch_generator,
    build_trained_model,
    evaluate,
    get_batch,
    learning_rate,
    load_checkpoint,
    save_checkpoint,
    train,
)

pytest_plugins = ["lm_support"]

TINY = GPTConfig(block_size=16, vocab_size=97, n_layer=2, n_head=2, n_embd=32)


def _tokens(n: int = 5000, vocab: int = 97) -> np.ndarray:
    """A learnable stream: a noisy repeating pattern."""
    rng = np.random.default_rng(0)
    pattern = rng.integers(0, vocab, 31)
    data = np.tile(pattern, n // 31 + 1)[:n]
    noise = rng.random(n) < 0.1
    data[noise] = rng.integers(0, vocab, noise.sum())
    return data.astype(np.uint16)


def test_forward_shapes_loss_and_tied_weights() -> None:
    model = GPT(TINY)
    x = torch.randint(0, TINY.vocab_size, (3, 10))
    logits, loss = model(x)
    assert logits.shape == (3, 10, TINY.vocab_size) and loss is None
    logits, loss = model(x, x)
    assert loss is not None and loss.shape == () and abs(loss.item() - np.log(TINY.vocab_size)) < 0.5
    assert model.lm_head.weight is model.transformer.wte.weight
    loss.backward()
    assert model.transformer.wte.weight.grad is not None
    assert model.num_params() == sum(p.numel() for p in model.parameters()) - TINY.block_size * TINY.n_embd
    with pytest.raises(ValueError, match="block_size"):
        model(torch.zeros(1, TINY.block_size + 1, dtype=torch.long))
    with pytest.raises(ValueError, match="multiple of n_head"):
        GPTConfig(n_embd=30, n_head=4)


def test_attention_is_causal() -> None:
    model = GPT(TINY).eval()
    x = torch.randint(0, TINY.vocab_size, (1, 12))
    changed = x.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % TINY.vocab_size
    assert torch.allclose(model(x)[0][0, :8], model(changed)[0][0, :8], atol=1e-6)


def test_hf_gpt2_layout_loads_with_transposed_conv1d() -> None:
    ours = GPT(TINY).eval()
    conv1d = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
    hf_state = {k: (v.t() if k.endswith(conv1d) else v) for k, v in ours.state_dict().items()}
    hf_state["transformer.h.0.attn.bias"] = torch.ones(1)  # old causal-mask buffer: ignored
    loaded = GPT.from_hf_state_dict(hf_state, TINY).eval()
    x = torch.randint(0, TINY.vocab_size, (2, 9))
    assert torch.equal(ours(x)[0], loaded(x)[0])


def test_learning_rate_schedule() -> None:
    config = TrainConfig(max_iters=100, learning_rate=1e-3, warmup_iters=10)
    assert learning_rate(0, config) == pytest.approx(1e-3 / 11)
    assert learning_rate(10, config) == pytest.approx(1e-3)
    assert learning_rate(55, config) == pytest.approx(1e-4 + 0.5 * 9e-4)
    assert learning_rate(100, config) == pytest.approx(1e-4) == learning_rate(500, config)


def test_batches_are_a_function_of_seed_and_step() -> None:
    data = _tokens()
    x1, y1 = get_batch(data, 4, 8, batch_generator(0, 5))
    x2, _ = get_batch(data, 4, 8, batch_generator(0, 5))
    x3, _ = get_batch(data, 4, 8, batch_generator(0, 6))
    assert torch.equal(x1, x2) and not torch.equal(x1, x3)
    assert x1.dtype == torch.long and x1.shape == (4, 8) and torch.equal(x1[:, 1:], y1[:, :-1])


def test_evaluate_is_deterministic_and_keeps_the_mode() -> None:
    model = GPT(TINY.model_copy(update={"dropout": 0.2}))
    model.train()
    a = evaluate(model, _tokens(), batches=3, batch_size=4)
    assert a == evaluate(model, _tokens(), batches=3, batch_size=4) and model.training


def test_loss_falls_on_the_mini_corpus(mini_corpus: Corpus) -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=32, vocab_size=50304, n_layer=2, n_head=2, n_embd=32))
    before = evaluate(model, mini_corpus.bin_path("val"), batches=4, batch_size=4)
    config = TrainConfig(max_iters=30, batch_size=4, learning_rate=1e-2, warmup_iters=4, eval_batches=4,
                         log_interval=10)
    result = train(model, mini_corpus.bin_path("train"), config, val_data=mini_corpus.bin_path("val"),
                   progress=False)
    assert result.finished and result.iters == 30 and result.val_loss is not None
    assert result.val_loss < before - 2.0, (before, result.val_loss)
    assert [h["iter"] for h in result.history if "loss" in h] == [10, 20, 30]


@pytest.mark.parametrize("use_safetensors", [True, False])
def test_checkpoint_round_trip(tmp_path: Path, use_safetensors: bool) -> None:
    model = GPT(TINY).eval()
    save_checkpoint(tmp_path / "ckpt", model, meta={"note": "x"}, use_safetensors=use_safetensors)
    weights = "model.safetensors" if use_safetensors else "model.pt"
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == sorted(["config.json", weights])
    ckpt = load_checkpoint(tmp_path / "ckpt")
    assert ckpt.meta == {"note": "x"} and ckpt.model.config == TINY and ckpt.train_state is None
    assert ckpt.model.lm_head.weight is ckpt.model.transformer.wte.weight
    x = torch.randint(0, TINY.vocab_size, (2, 9))
    assert torch.equal(model(x)[0], ckpt.model.eval()(x)[0])


def test_training_resumes_to_the_same_weights(tmp_path: Path) -> None:
    config = TrainConfig(max_iters=8, batch_size=4, learning_rate=3e-3, warmup_iters=2, grad_accum_steps=2,
                         log_interval=2)
    dropout = TINY.model_copy(update={"dropout": 0.1})  # the RNG state must survive the checkpoint too
    torch.manual_seed(1)
    straight = GPT(dropout)
    train(straight, _tokens(), config, checkpoint_dir=tmp_path / "a", progress=False)
    torch.manual_seed(1)
    first = GPT(dropout)
    stopped = train(first, _tokens(), config, checkpoint_dir=tmp_path / "b", time_budget_s=0, progress=False)
    assert not stopped.finished and stopped.iters == 1
    torch.manual_seed(99)  # the resumed run must not depend on the caller's RNG
    resumed = GPT(dropout)
    result = train(resumed, _tokens(), config, checkpoint_dir=tmp_path / "b", progress=False)
    assert result.finished and result.iters == 8
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    with pytest.raises(ValueError, match="different configuration"):
        train(GPT(dropout), _tokens(), config.model_copy(update={"max_iters": 9}),
              checkpoint_dir=tmp_path / "b", progress=False)


def test_trained_model_asset_resumes_after_its_time_budget(tmp_path: Path, mini_corpus: Corpus) -> None:
    model_config = GPTConfig(block_size=16, vocab_size=50304, n_layer=1, n_head=2, n_embd=16)
    config = TrainConfig(max_iters=6, batch_size=2, learning_rate=1e-2, warmup_iters=1, eval_batches=2)
    straight = build_trained_model("tiny", model_config, config, mini_corpus, cache_dir=tmp_path / "a",
                                   progress=False)
    with pytest.raises(BuildIncomplete, match="run the same build again"):
        build_trained_model("tiny", model_config, config, mini_corpus, cache_dir=tmp_path / "b",
                            time_budget_s=0, progress=False)
    resumed = build_trained_model("tiny", model_config, config, mini_corpus, cache_dir=tmp_path / "b",
                                  progress=False)
    assert resumed.manifest.files == straight.manifest.files
    assert resumed.manifest.stats["iters"] == 6 and resumed.manifest.stats["heldout_loss"] > 0
    assert resumed.load().config == model_config
