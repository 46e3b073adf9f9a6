"""GCIDE (Debian's dict-gcide: Webster's 1913 and WordNet) read from its dictd files: entries, and their
senses as plain English, without the pronunciations, etymologies and citation markup.

A small model trained on the raw dictionary spends most of what it learns on markup
(`\\A*bate"\\ ([.a]*b[=a]t"), v. t. [imp. & p. p. {Abated}; ...]`) and answers in it; the plain form
("Abate (verb): To bring down or reduce from a higher to a lower state.") is what a definition looks
like in prose.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterator
from pathlib import Path

PARTS = {"n.": "noun", "v. t.": "verb", "v. i.": "verb", "a.": "adjective", "adv.": "adverb"}
_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_HEAD = re.compile(
    r"^(?P<word>[A-Za-z][a-z]+) \\[^\\\n]+\\(?: \([^)\n]*\))?,? (?P<pos>v\. t\.|v\. i\.|n\.|a\.|adv\.)")


def _b64(text: str) -> int:
    value = 0
    for c in text:
        value = value * 64 + _B64.index(c)
    return value


def gcide_entries(dictd: Path) -> Iterator[tuple[str, str]]:
    """(headword, entry text) of dictd's gcide.index and gcide.dict.dz (gzip-compatible), in order."""
    data = gzip.decompress((dictd / "gcide.dict.dz").read_bytes())
    for line in (dictd / "gcide.index").read_text(encoding="utf-8", errors="replace").splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and not parts[0].startswith("00-"):
            offset, length = _b64(parts[1]), _b64(parts[2])
            yield parts[0], data[offset:offset + length].decode("utf-8", "replace")


def _strip_brackets(text: str) -> str:
    """Leading bracketed groups ([etymology], [imp. & p. p. ...]) and parenthesised labels, nested ones
    included."""
    text = text.lstrip()
    while text and text[0] in "[(":
        close, depth = {"[": "]", "(": ")"}[text[0]], 0
        for i, c in enumerate(text):
            depth += c == text[0]
            depth -= c == close
            if depth == 0:
                text = text[i + 1:].lstrip(" .,;")
                break
        else:
            return ""
    return text


def _gloss(sense: str, max_words: int = 20) -> str | None:
    """The first clause of one sense, cleaned, or None where it is not plain (obsolete, a cross-reference,
    markup left, too short or too long)."""
    body = _strip_brackets(" ".join(sense.split()))
    if "Obs." in body[:200] or body.startswith(("See", "Same as", "Alt.", "pl.", "of ")):
        return None
    gloss = re.split(r";|\. |\[|--|\(\w+\.\)", body)[0].strip().rstrip(".,:")
    gloss = re.sub(r",? (esp|etc|e\.g|i\.e|as|or)$", "", gloss.replace("{", "").replace("}", ""))
    if re.search(r"[\\\[\]{}*\"=^`~|<>]", gloss) or not gloss[:1].isalpha():
        return None
    if not 2 <= len(gloss.split()) <= max_words:
        return None
    return gloss[0].upper() + gloss[1:] + "."


def senses(entry: str, word: str | None = None) -> tuple[str, str, list[str]] | None:
    """(headword, part of speech, plain glosses of its numbered senses, first first) of a GCIDE entry, or
    None where it has no plain first sense; `word`: only the entry of this word (the index sends
    inflected forms, "derided", to their word's entry, "Deride")."""
    head = _HEAD.match(entry)
    if head is None or (word is not None and head["word"].lower() != word):
        return None
    paragraphs = entry[head.end():].split("\n\n")
    first = _strip_brackets(" ".join(paragraphs[0].split()))
    first = _strip_brackets(re.sub(r"^1\.\s*", "", first))
    glosses = [g for g in [_gloss(first)] if g]
    if not glosses:
        return None
    for paragraph in paragraphs[1:]:
        numbered = re.match(r"\s*\d+\.\s*(.*)", paragraph, re.DOTALL)
        if numbered and (g := _gloss(numbered[1])) and g not in glosses:
            glosses.append(g)
    return head["word"], PARTS[head["pos"]], glosses


def first_sense(entry: str, word: str | None = None) -> tuple[str, str] | None:
    """(part of speech, gloss of the first sense) of an entry (see `senses`)."""
    found = senses(entry, word)
    return None if found is None else (found[1], found[2][0])


def plain_entries(dictd: Path) -> Iterator[str]:
    """Every entry with a plain sense as one line of prose: "Lantern (noun): Something inclosing a light,
    and protecting it from wind, rain. An open structure of light material set upon a roof." """
    for headword, entry in gcide_entries(dictd):
        found = senses(entry, headword.lower())
        if found is not None:
            yield f"{found[0]} ({found[1]}): {' '.join(found[2][:4])}"
