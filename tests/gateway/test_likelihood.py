"""The offline model's PyTorch copy: its GGUF parsed once per conversion, and its echo (`Likelihood`), on
a tiny random Gemma 3 with GPT-2's tokenizer: texts are scored in batches by length, and rows that texts
share are scored once; neither may change a number."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from openrebench.gateway import _likelihood
from openrebench.gateway._likelihood import ECHO_BATCH, Likelihood, _gguf_read_once

pytest_plugins = ["lm_support"]


@pytest.fixture(scope="module")
def tiny_model(lm_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, Gemma3TextConfig

    folder = tmp_path_factory.mktemp("tiny-gemma")
    config = Gemma3TextConfig(vocab_size=50257, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=16, bos_token_id=50256,
                              eos_token_id=50256, pad_token_id=0, sliding_window=8)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    config.save_pretrained(folder)
    save_model(model, str(folder / "model.safetensors"))
    gpt2 = lm_home / "lm" / "tokenizer-gpt2"
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(gpt2 / name, folder / name)
    return folder


def test_batched_and_shared_rows_give_what_each_text_alone_gives(tiny_model: Path) -> None:
    question = "Question: What does the word lantern mean?\nAnswer:"
    answers = ["a light", "a case that holds a light and keeps the wind from it", "", "a light", "no"]
    texts = [f"{question} {a}".rstrip() for a in answers] + [f"Answer: {a}" for a in answers if a]
    texts += ["Question: What is a river?\nAnswer: water that flows", "x", "Answer:"]
    assert len(texts) > ECHO_BATCH  # more than one batch, of texts of different lengths, in mixed order
    likelihood = Likelihood(tiny_model)
    together = likelihood.echo(texts)
    alone = [likelihood.echo([t])[0] for t in texts]
    assert len(together) == len(texts)
    for text, a, b in zip(texts, together, alone, strict=True):
        assert a["tokens"] == b["tokens"] and "".join(a["tokens"]) == text
        assert a["text_offset"] == b["text_offset"] and a["top_logprobs"] is None
        assert len(a["token_logprobs"]) == len(a["tokens"])
        assert a["token_logprobs"] == pytest.approx(b["token_logprobs"], abs=1e-4), text
        assert all(v < 0 for v in a["token_logprobs"])
    # texts that begin alike get the same numbers for what they share
    first, second = together[0]["token_logprobs"], together[1]["token_logprobs"]
    shared = len(likelihood.echo([question])[0]["tokens"])
    assert first[:shared] == second[:shared]
    assert together[0]["token_logprobs"] == together[3]["token_logprobs"]  # the same text twice


def test_the_vocabularys_product_a_block_of_rows_at_a_time_changes_no_number(
        tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The output layer runs over blocks of rows (so that long prompts cannot fill the harness's memory):
    blocks of 3 rows give what one block of all gives."""
    texts = ["Question: What does the word lantern mean?\nAnswer: a light", "Answer: a case for a light",
             "x", "Question: What is a river?\nAnswer: water that flows " * 3]
    likelihood = Likelihood(tiny_model)
    whole = likelihood.echo(texts)
    monkeypatch.setattr(_likelihood, "LOGIT_ROWS", 3)
    blocks = likelihood.echo(texts)
    for a, b in zip(whole, blocks, strict=True):
        assert a["tokens"] == b["tokens"]
        assert a["token_logprobs"] == pytest.approx(b["token_logprobs"], abs=1e-5)
    assert sum(len(a["tokens"]) for a in whole) > 3 * 4  # several blocks were needed


def test_the_model_is_loaded_whole_from_its_file(tiny_model: Path) -> None:
    """Built without random initialisation, every weight and buffer is what a fully initialised model
    given the same file holds, tied weights still tied, and it computes the same numbers."""
    import torch
    from safetensors.torch import load_model
    from transformers import AutoConfig, AutoModelForCausalLM

    likelihood = Likelihood(tiny_model)
    assert likelihood._model is None and likelihood.ready() and likelihood._model is not None  # loaded now
    likelihood.echo(["x"])
    fast = likelihood._model
    torch.manual_seed(1)  # another draw of the initial weights: the file must replace all of them
    full = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_model), dtype=torch.float32)
    load_model(full, str(tiny_model / "model.safetensors"))
    ours, theirs = fast.state_dict(), full.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    assert fast.lm_head.weight.data_ptr() == fast.model.embed_tokens.weight.data_ptr()
    x = torch.tensor([[50256, 10, 200, 3000]])
    with torch.no_grad():
        assert torch.equal(fast(x).logits, full.eval()(x).logits)


def test_an_overlong_or_empty_prompt_is_refused_whole(tiny_model: Path) -> None:
    likelihood = Likelihood(tiny_model)
    with pytest.raises(ValueError, match="empty prompt"):
        likelihood.echo(["fine", ""])
    with pytest.raises(ValueError, match="longer than the 1024"):
        likelihood.echo(["fine", "word " * 1100])


def test_the_offline_models_gguf_is_parsed_once_per_conversion(tmp_path: Path) -> None:
    """transformers parses a GGUF for the tokenizer, the config and the weights; inside the conversion
    every parse of one file gets the first reader (same fields, same tensors), and outside it readers are
    made afresh again."""
    import gguf
    import numpy as np

    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])
    writer.add_tensor("x", np.arange(4, dtype=np.float32).reshape(2, 2))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    real = gguf.GGUFReader
    with _gguf_read_once():
        first = gguf.GGUFReader(path)
        assert gguf.GGUFReader(str(path)) is first  # by path, however it is spelled
        assert [t.name for t in first.tensors] == ["x"] and "tokenizer.ggml.tokens" in first.fields
        assert first.tensors[0].data.tolist() == [[0.0, 1.0], [2.0, 3.0]]
    assert gguf.GGUFReader is real and real(path) is not first
