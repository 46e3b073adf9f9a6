"""The instructions: prompts to train on, demonstrations for the SFT reference model, held-out prompts.

Full tier: Stanford Alpaca (52k instructions with demonstrations) through Hugging Face `datasets`, as in
the paper. Mini tier, offline: instructions built from two public-domain sources a package manager
gives, GCIDE (Debian's dict-gcide: Webster's 1913 and WordNet) and the chatterbot corpus (PyPI):

- "What does the word "lantern" mean?", "Define the word ...", "Explain in a few words what ... means"
  (the demonstration: the first sense of the word's first entry, e.g. "Something inclosing a light,
  and protecting it from wind, rain.");
- "What part of speech is the word "bake"?" ("Bake" is a verb.);
- the chatterbot corpus's questions and answers ("What is a computer?").

Words (and chatterbot questions) are split by a hash into three disjoint sets, so no held-out word is
asked about in training prompts or demonstrations; the base model has read the dictionary, as GPT-2 had
read the web.
"""

from __future__ import annotations

import hashlib
import random
import re
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openrebench.lm import first_sense, gcide_entries

DEFINE = (
    'What does the word "{w}" mean?',
    'Define the word "{w}".',
    'Explain in a few words what "{w}" means.',
)
PART = 'What part of speech is the word "{w}"?'
CHATTERBOT = ("chatterbot-corpus", "1.3.3")


def family_of(instruction: str) -> str:
    """The kind of a dictionary-tier instruction (as `Example.family`): part, define or chat."""
    if re.fullmatch(re.escape(PART).replace(re.escape("{w}"), ".+"), instruction):
        return "part"
    if any(re.fullmatch(re.escape(t).replace(re.escape("{w}"), ".+"), instruction) for t in DEFINE):
        return "define"
    return "chat"


@dataclass(frozen=True)
class Example:
    instruction: str
    response: str
    family: str
    key: str  # what the split is decided by: the word, or the chatterbot question


def gcide_examples(dictd: Path, keep: Callable[[str], bool]) -> list[Example]:
    """The dictionary's instructions: definitions and parts of speech of single lowercase words that
    `keep` accepts (the compact vocabulary must spell them), first entry of each word only."""
    seen: set[str] = set()
    out = []
    for headword, entry in gcide_entries(dictd):
        word = headword.lower()
        if word in seen or not re.fullmatch(r"[A-Za-z][a-z]{2,11}", headword):
            continue
        sense = first_sense(entry, word)
        if sense is None or not keep(word):
            continue
        seen.add(word)
        part, gloss = sense
        variant = int(hashlib.sha256(word.encode()).hexdigest(), 16) % (len(DEFINE) + 1)
        if variant == len(DEFINE):
            article = "an" if part[0] in "aeiou" else "a"
            out.append(
                Example(PART.format(w=word), f'"{word.capitalize()}" is {article} {part}.', "part", word)
            )
        else:
            out.append(Example(DEFINE[variant].format(w=word), gloss, "define", word))
    return out


def chatterbot_examples(archive: Path) -> list[Example]:
    """Question-and-answer pairs of the chatterbot corpus's English conversations (its YAML files, read
    out of the wheel): a question ending in '?' and an answer of 2 to 30 words."""
    import yaml

    out = []
    with zipfile.ZipFile(archive) as z:
        for name in sorted(z.namelist()):
            if not re.search(r"chatterbot_corpus/data/english/[^/]+\.yml$", name):
                continue
            try:
                doc = yaml.safe_load(z.read(name).decode("utf-8", "replace")) or {}
            except yaml.YAMLError:
                continue
            for talk in doc.get("conversations") or []:
                if not isinstance(talk, list) or len(talk) < 2:
                    continue
                question, answer = (" ".join(str(x).split()) for x in talk[:2])
                if question.endswith("?") and 2 <= len(answer.split()) <= 30 and len(question.split()) >= 2:
                    out.append(Example(question, answer, "chat", question.lower()))
    seen: set[str] = set()
    return [e for e in out if not (e.key in seen or seen.add(e.key))]  # type: ignore[func-returns-value]


def split_of(key: str, seed: int, fractions: tuple[float, float]) -> str:
    """`train` (prompts for the agent), `sft` (demonstrations for the reference model) or `heldout`."""
    x = int(hashlib.sha256(f"{seed}:{key}".encode()).hexdigest()[:12], 16) / 16**12
    return "heldout" if x < fractions[1] else "sft" if x < fractions[0] + fractions[1] else "train"


def split_examples(
    examples: Iterable[Example],
    seed: int,
    n_heldout: int,
    n_sft: int,
    n_train: int,
    fractions: tuple[float, float] = (0.3, 0.15),
) -> dict[str, list[Example]]:
    """Disjoint sets by key, each shuffled with `seed` and cut to its size; the held-out one balanced
    across families (as evenly as each family allows)."""
    sets: dict[str, list[Example]] = {"train": [], "sft": [], "heldout": []}
    for e in examples:
        sets[split_of(e.key, seed, fractions)].append(e)
    rng = random.Random(seed)
    for name in sets:
        rng.shuffle(sets[name])
    by_family: dict[str, list[Example]] = {}
    for e in sets["heldout"]:
        by_family.setdefault(e.family, []).append(e)
    heldout: list[Example] = []
    while len(heldout) < n_heldout and any(by_family.values()):
        for family in sorted(by_family):
            if by_family[family] and len(heldout) < n_heldout:
                heldout.append(by_family[family].pop())
    return {"train": sets["train"][:n_train], "sft": sets["sft"][:n_sft], "heldout": heldout}


def alpaca_examples(
    rows: Iterable[dict[str, Any]] | None = None, dataset: str = "tatsu-lab/alpaca"
) -> list[Example]:
    """Stanford Alpaca's instructions (with their inputs) and demonstrations, through `datasets` when
    `rows` is not given (a one-line error without it or without the Hub)."""
    if rows is None:
        from openrebench.api import OpenRebenchError

        try:
            import datasets
        except ImportError:
            raise OpenRebenchError(
                "chat_rl's full tier needs Hugging Face datasets for Alpaca: pip install datasets"
            ) from None
        try:
            rows = datasets.load_dataset(dataset, split="train")
        except Exception as e:
            raise OpenRebenchError(
                f"cannot load {dataset} from the Hugging Face Hub "
                f"({type(e).__name__}: {str(e).splitlines()[0][:200]})"
            ) from None
    out = []
    for row in rows:
        instruction, extra, output = (
            str(row.get(k) or "").strip() for k in ("instruction", "input", "output")
        )
        if not instruction or not output:
            continue
        text = f"{instruction}\n\n{extra}" if extra else instruction
        out.append(Example(text, output, "alpaca", text.lower()))
    return out
