"""chat_rl's probes: models that answer without reading the question, which `openrebench calibrate
chat_rl` scores to show that none comes near the start. Apart from the assets the runs need
(`_assets.py`) because only calibration and its tests build them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from openrebench.api import TierSpec, stage
from openrebench.lm import assets_root, cached_build

from . import chat_lm
from ._assets import BUILDER_VERSION, _manifest_key, build
from .params import ChatRLParams

_LONG = ("It is a common and well known thing that many people use or see in their daily life, and most "
         "of them know what it is and what it is for. ")
PROBES: dict[str, str] = {
    "one fixed sentence": "one sentence for every instruction",
    "a template per kind": "one sentence per kind of instruction (definition, part of speech, chat)",
    "the instruction copied": "the instruction, word for word",
    "empty": "nothing (the end token at once)",
    "very long": "a long paragraph that fits any question, until the token limit",
    "keyword stuffing": "the commonest English words, over and over",
}
"""The question-independent policies `openrebench calibrate chat_rl` scores (invariant 4: none may come
near the start). Each is learned by the base model from the training prompts, as an agent would teach it."""


PROBE_LR = 1e-3  # a fixed answer is quickly learned


def probe_answer(name: str, instruction: str) -> str:
    """What the probe `name` answers to `instruction` (the instruction is read only to copy it, or to
    tell its kind)."""
    from . import data

    if name == "one fixed sentence":
        return "It is a very good question, and the answer is simple."
    if name == "a template per kind":
        kind = data.family_of(instruction)
        return {"define": "A person or thing that is used for a purpose.",
                "part": "It is a noun.", "chat": "Yes, I think so too."}[kind]
    if name == "the instruction copied":
        return instruction
    if name == "empty":
        return ""
    if name == "very long":
        return _LONG * 4
    if name == "keyword stuffing":
        return "the of and a to in is it that was for on are with as " * 3
    raise KeyError(name)


def build_probe(spec: TierSpec[ChatRLParams], cache_dir: Path, name: str) -> Path:
    """The base model finetuned to answer every training prompt as the probe `name` does (cached)."""
    p = spec.params
    built = build(spec, cache_dir)
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    folder = assets_root(cache_dir) / f"chatrl-{spec.name}-probe-{slug}"

    def make(partial: Path, deadline: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        import torch

        torch.manual_seed(0)
        model = chat_lm.load_model(built.base, p.device)
        prompts = [r["instruction"] for r in chat_lm.read_jsonl(built.data / "train.jsonl")]
        with stage(f"teaching the base model the probe '{name}' ({p.probe_steps} steps)"):
            losses = chat_lm.finetune(model, chat_lm.ChatTokenizer(built.tokenizer),
                                      [(q, probe_answer(name, q)) for q in prompts], steps=p.probe_steps,
                                      batch_size=16, learning_rate=PROBE_LR, mask_prompt=True, seed=0)
        chat_lm.save_model(model.cpu(), partial)
        return {}, {"last_loss": sum(losses[-10:]) / len(losses[-10:])}

    cached_build(
        folder,
        what=f"chatrl:{spec.name}-probe",
        builder_version=BUILDER_VERSION,
        seed=0,
        params={"probe": name, "answer": probe_answer(name, "Define the word \"probe\"."),
                "base": _manifest_key(built.base), "data": _manifest_key(built.data), "steps": p.probe_steps},
        build=make,
        label=f"chat_rl: the probe '{name}'",
    )
    return folder
