"""chat_rl's assets, each built once into the cache (`<cache>/lm/chatrl-<tier>-*`, with manifests):

without the judge (`build`): the tokenizer, the base model (GPT-2 from the Hub where it is reachable and
the tier names one, else a GPT trained here on the tier's corpus), the instructions (training prompts,
demonstrations, held-out prompts), the SFT reference model (the base finetuned on the demonstrations)
and both reference models' answers to the held-out prompts;

with the judge (`build_with_judge` in `_judged.py`, through the run's model access): the starting model
(the starting pipeline run on the base model against the judge), the reference model (the reference
pipeline), and, for the likelihood judge, its scores of the reference answers. These are keyed by the
judge model.

The calibration's probes (models that answer without reading the question) are built in `_probes.py`.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openrebench.api import OpenRebenchError, TierSpec, stage
from openrebench.base import usable_cores
from openrebench.lm import (
    GPTConfig,
    TrainConfig,
    assets_root,
    build_corpus,
    build_trained_model,
    cached_build,
    compact_corpus,
    gcide_root,
    gpt2_hf_tokenizer,
)

from . import chat_lm
from .params import ChatRLParams

HERE = Path(__file__).parent
BUILDER_VERSION = "1"
ANSWER_SEED = 1234  # the reference models' stored answers: drawn once, with the scorer's settings
SHARED = ("chat_lm.py", "evaluation.py")


@dataclass(frozen=True)
class Built:
    tokenizer: Path
    base: Path
    data: Path
    sft: Path
    answers: Path


def settings(p: ChatRLParams) -> dict[str, Any]:
    """What the workspace's settings.json tells the agent's code (and the scorer does): the judge's
    method and the scorer's sampling settings."""
    return {
        "judge_method": p.judge_method,
        "max_new_tokens": p.max_new_tokens,
        "temperature": p.temperature,
        "top_k": p.top_k,
    }


def _tokenizer(spec: TierSpec[ChatRLParams], cache_dir: Path) -> tuple[Path, Any]:
    p = spec.params
    corpus = build_corpus(p.corpus, cache_dir, progress=False)
    data = compact_corpus(corpus, p.vocab_size, cache_dir) if p.vocab_size < 50257 else corpus
    folder = assets_root(cache_dir) / f"chatrl-{spec.name}-tokenizer"

    def build(partial: Path, deadline: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        (partial / "tokenizer.json").write_text(gpt2_hf_tokenizer(cache_dir).to_str())
        if data is not corpus:
            table = json.loads((data.path / "vocab.json").read_text())
            if 50256 not in table["gpt2_ids"]:
                raise OpenRebenchError("the compact vocabulary lacks GPT-2's end token")
            (partial / "compact.json").write_text(json.dumps(table) + "\n")
        return {"corpus": str(data.path)}, {}

    cached_build(
        folder,
        what=f"chatrl:{spec.name}-tokenizer",
        builder_version=BUILDER_VERSION,
        seed=None,
        params={"corpus": data.manifest.key()},
        build=build,
        label="chat_rl: the tokenizer",
    )
    return folder, data


TRAIN_TWO_THREADS = 500_000  # parameters: a model this large trains at set-up on two CPU threads


def training_threads(p: ChatRLParams) -> int:
    """Math threads for training a base model on a CPU at set-up (pretraining, then the SFT reference,
    on batches as large): two where the model is large enough to split
    (the mini tier's, 1.8M parameters on batches of 16 x 128 tokens: 40 steps in 13.5-14.1 s against
    23.2-25.4 s on one thread, a quiet 2-core Xeon), one for a smaller one (the tests': its ops are too
    small to split, and on cores other work shares a second thread waits, see chat_lm.cpu_threads); never
    more than two, so a machine's core count beyond that does not change the model."""
    params = p.n_layer * 12 * p.n_embd**2 + p.vocab_size * p.n_embd
    return usable_cores(at_most=2) if params >= TRAIN_TWO_THREADS else 1


def _hub_base(name: str) -> Any | None:
    """GPT-2 (`gpt2-xl`...) from the Hub, or None where the Hub cannot be reached."""
    try:
        from huggingface_hub import model_info

        model_info(name, timeout=10)
    except Exception:
        return None
    from transformers import GPT2LMHeadModel

    return GPT2LMHeadModel.from_pretrained(name)


def _base(spec: TierSpec[ChatRLParams], cache_dir: Path, data: Any) -> Path:
    p = spec.params
    folder = assets_root(cache_dir) / f"chatrl-{spec.name}-base"
    hub = _hub_base(p.base_hub) if p.base_hub else None
    if hub is not None:

        def from_hub(partial: Path, deadline: Any) -> tuple[dict[str, Any], dict[str, Any]]:
            chat_lm.save_model(hub, partial)
            return {"huggingface": p.base_hub}, {"params": sum(x.numel() for x in hub.parameters())}

        cached_build(
            folder,
            what=f"chatrl:{spec.name}-base",
            builder_version=BUILDER_VERSION,
            seed=None,
            params={"hub": p.base_hub},
            build=from_hub,
            label=f"chat_rl: {p.base_hub} from the Hub",
        )
        return folder
    model_config = GPTConfig(
        block_size=p.block_size,
        vocab_size=p.vocab_size,
        n_layer=p.n_layer,
        n_head=p.n_head,
        n_embd=p.n_embd,
        bias=True,
    )
    train_config = TrainConfig(
        max_iters=p.base_iters,
        batch_size=p.base_batch,
        learning_rate=p.base_lr,
        warmup_iters=max(1, p.base_iters // 10),
        device=p.device,
        eval_batches=10,
        checkpoint_interval_s=60,
        seed=11,
        compile=p.device == "cuda",
    )
    with chat_lm.math_threads(training_threads(p)) if p.device == "cpu" else contextlib.nullcontext():
        trained = build_trained_model(
            f"chatrl-{spec.name}-pretrained",
            model_config,
            train_config,
            data,
            cache_dir=cache_dir,
            progress=False,
            label="chat_rl: the base model",
        )

    def convert(partial: Path, deadline: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        chat_lm.save_model(trained.load().to_hf(), partial)
        return {"trained": str(trained.path)}, dict(trained.manifest.stats)

    cached_build(
        folder,
        what=f"chatrl:{spec.name}-base",
        builder_version=BUILDER_VERSION,
        seed=None,
        params={"trained": trained.manifest.key()},
        build=convert,
        label="chat_rl: the base model",
    )
    return folder


def _examples(spec: TierSpec[ChatRLParams], work: Path, tokenizer: chat_lm.ChatTokenizer) -> list[Any]:
    from openrebench.lm import pypi_archive, sources_dir

    from . import data

    if spec.params.data == "alpaca":
        return data.alpaca_examples()
    root, _ = gcide_root(work)

    def spelled(text: str) -> bool:
        return tokenizer.unk_id is None or tokenizer.unk_id not in tokenizer.encode(text)

    out = data.gcide_examples(root / "usr/share/dictd", keep=lambda w: spelled(f' "{w}" {w}'))
    name, version = data.CHATTERBOT
    sources_dir()
    wheel = pypi_archive(name, version, sdist=False)
    out += [e for e in data.chatterbot_examples(wheel) if spelled(e.instruction)]
    return out


def _data(spec: TierSpec[ChatRLParams], cache_dir: Path, tokenizer_dir: Path) -> Path:
    from . import data

    p = spec.params
    folder = assets_root(cache_dir) / f"chatrl-{spec.name}-data"

    def build(partial: Path, deadline: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        with stage("instructions"):
            examples = _examples(spec, partial / "work", chat_lm.ChatTokenizer(tokenizer_dir))
            # The split is drawn afresh for each build and never written down: the dictionary and this
            # code are public, so a fixed seed would tell an agent which words are held out.
            sets = data.split_examples(
                examples, seed=secrets.randbits(31), n_heldout=p.n_heldout, n_sft=p.n_sft,
                n_train=p.n_train_prompts
            )
        if len(sets["heldout"]) < p.n_heldout or len(sets["train"]) < p.n_train_prompts:
            raise OpenRebenchError(
                f"chat_rl ({spec.name}): only {len(sets['heldout'])} held-out and "
                f"{len(sets['train'])} training instructions"
            )
        _write(partial / "train.jsonl", [{"instruction": e.instruction} for e in sets["train"]])
        _write(
            partial / "sft.jsonl",
            [{"instruction": e.instruction, "response": e.response} for e in sets["sft"]],
        )
        _write(
            partial / "heldout.jsonl",
            [{"instruction": e.instruction, "family": e.family} for e in sets["heldout"]],
        )
        families: dict[str, int] = {}
        for e in sets["heldout"]:
            families[e.family] = families.get(e.family, 0) + 1
        return {"data": p.data}, {
            "examples": len(examples),
            **{k: len(v) for k, v in sets.items()},
            "heldout_families": families,
        }

    cached_build(
        folder,
        what=f"chatrl:{spec.name}-data",
        builder_version=BUILDER_VERSION,
        seed=0,
        params={
            "data": p.data,
            "n": [p.n_train_prompts, p.n_sft, p.n_heldout],
            "tokenizer": _manifest_key(tokenizer_dir),
        },
        build=build,
        label="chat_rl: the instructions",
    )
    return folder


def _write(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _manifest_key(folder: Path) -> dict[str, Any]:
    from openrebench.lm import load_manifest

    manifest = load_manifest(folder)
    return manifest.key() if manifest else {}


def _sft(spec: TierSpec[ChatRLParams], cache_dir: Path, built: dict[str, Path]) -> Path:
    p = spec.params
    folder = assets_root(cache_dir) / f"chatrl-{spec.name}-sft"

    def build(partial: Path, deadline: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        import torch

        torch.manual_seed(0)
        model = chat_lm.load_model(built["base"], p.device)
        demos = [(r["instruction"], r["response"]) for r in chat_lm.read_jsonl(built["data"] / "sft.jsonl")]
        with stage(f"finetuning on the demonstrations ({p.sft_steps} steps)"):
            losses = chat_lm.finetune(
                model,
                chat_lm.ChatTokenizer(built["tokenizer"]),
                demos,
                steps=p.sft_steps,
                batch_size=p.sft_batch,
                learning_rate=p.sft_lr,
                mask_prompt=True,
                seed=0,
                threads=training_threads(p),  # batches as large as pretraining's: they split as well
            )
        chat_lm.save_model(model.cpu(), partial)
        return {}, {"first_loss": losses[0], "last_loss": sum(losses[-10:]) / len(losses[-10:])}

    cached_build(
        folder,
        what=f"chatrl:{spec.name}-sft",
        builder_version=BUILDER_VERSION,
        seed=0,
        params={
            "base": _manifest_key(built["base"]),
            "data": _manifest_key(built["data"]),
            "steps": p.sft_steps,
            "batch": p.sft_batch,
            "lr": p.sft_lr,
        },
        build=build,
        label="chat_rl: the SFT reference model",
    )
    return folder


def _answers(spec: TierSpec[ChatRLParams], cache_dir: Path, built: dict[str, Path]) -> Path:
    p = spec.params
    folder = assets_root(cache_dir) / f"chatrl-{spec.name}-answers"

    def build(partial: Path, deadline: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        tokenizer = chat_lm.ChatTokenizer(built["tokenizer"])
        rows = chat_lm.read_jsonl(built["data"] / "heldout.jsonl")
        prompts = [r["instruction"] for r in rows]
        answers = {}
        for name in ("base", "sft"):
            with stage(f"the {name} model's answers"):
                model = chat_lm.load_model(built[name], p.device)
                answers[name] = chat_lm.generate(
                    model,
                    tokenizer,
                    prompts,
                    max_new_tokens=p.max_new_tokens,
                    temperature=p.temperature,
                    top_k=p.top_k,
                    seed=ANSWER_SEED,
                )
        _write(
            partial / "heldout.jsonl",
            [
                {**r, "base_answer": a, "sft_answer": b}
                for r, a, b in zip(rows, answers["base"], answers["sft"], strict=True)
            ],
        )
        empty = {k: sum(not a for a in v) for k, v in answers.items()}
        return {}, {"empty_answers": empty}

    cached_build(
        folder,
        what=f"chatrl:{spec.name}-answers",
        builder_version=BUILDER_VERSION,
        seed=ANSWER_SEED,
        params={
            "base": _manifest_key(built["base"]),
            "sft": _manifest_key(built["sft"]),
            "data": _manifest_key(built["data"]),
            "settings": settings(p),
        },
        build=build,
        label="chat_rl: the reference models' answers",
    )
    return folder


def build(spec: TierSpec[ChatRLParams], cache_dir: Path) -> Built:
    """Everything that needs no judge (see the module's docstring)."""
    tokenizer, corpus = _tokenizer(spec, cache_dir)
    built = {"tokenizer": tokenizer, "base": _base(spec, cache_dir, corpus)}
    built["data"] = _data(spec, cache_dir, tokenizer)
    built["sft"] = _sft(spec, cache_dir, built)
    built["answers"] = _answers(spec, cache_dir, built)
    return Built(**built)


def workspace_files(built: Built) -> list[tuple[Path, str]]:
    """(source, destination) of the workspace's shared files: what a pipeline run needs."""
    return [
        (built.base, "base_model"),
        (built.tokenizer, "tokenizer"),
        (built.data / "train.jsonl", "prompts.jsonl"),
        *((HERE / f, f) for f in SHARED),
    ]
