"""The GPT-2 BPE tokenizer, usable offline, as a tiktoken Encoding and as a Hugging Face tokenizer.

OpenAI's GPT-2 ranks ship in PyPI's `openai-whisper` sdist (`whisper/assets/gpt2.tiktoken`, the same
bytes as tiktoken's r50k_base). From them we rebuild OpenAI's `encoder.json` and `vocab.bpe` byte for
byte (checked against tiktoken's own sha256s) and write them under the names both libraries expect:
`vocab.json`/`merges.txt` for `GPT2TokenizerFast.from_pretrained(folder)` and `tokenizers`, and
sha1(url)-named copies in `tiktoken/` for `TIKTOKEN_CACHE_DIR`. Where pip cannot reach PyPI but the
network allows, tiktoken's own download provides the ranks instead.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from openrebench.api import AssetError, Deadline, assets_root, cached_build

from ._sources import pypi_archive

if TYPE_CHECKING:
    import tiktoken
    import tokenizers

BUILDER_VERSION = "1"
EOT = 50256
EOT_TEXT = "<|endoftext|>"
VOCAB_SIZE = 50257

WHISPER = ("openai-whisper", "20250625", "37a91a3921809d9f44748ffc73c0a55c9f366c85a3ef5c2ae0cc09540432eb96")
_BLOB = "https://openaipublic.blob.core.windows.net"
# url -> sha256 of its content, as tiktoken checks them (tiktoken_ext/openai_public.py)
URLS = {
    "r50k_base.tiktoken": (f"{_BLOB}/encodings/r50k_base.tiktoken",
                           "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"),
    "vocab.bpe": (f"{_BLOB}/gpt-2/encodings/main/vocab.bpe",
                  "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"),
    "encoder.json": (f"{_BLOB}/gpt-2/encodings/main/encoder.json",
                     "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"),
}
# tiktoken's GPT-2 split pattern (equivalent to the original release's, faster)
PAT_STR = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (how vocab.json spells byte tokens)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


def parse_tiktoken(data: bytes) -> dict[bytes, int]:
    return {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in data.splitlines()
                                                                    if line)}


def _merge_of(token: bytes, rank: int, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The pair whose merge made `token`: BPE over its bytes with only the merges ranked before it."""
    parts = [bytes([b]) for b in token]
    while len(parts) > 2:
        best = min((ranks.get(parts[i] + parts[i + 1], rank), i) for i in range(len(parts) - 1))
        if best[0] >= rank:
            break
        i = best[1]
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    if len(parts) != 2:
        raise AssetError(f"token {token!r} (rank {rank}) is not one merge of two earlier tokens")
    return parts[0], parts[1]


def data_gym_files(ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """OpenAI's (encoder.json, vocab.bpe) for GPT-2, rebuilt from the ranks."""
    to_text = bytes_to_unicode()

    def spell(token: bytes) -> str:
        return "".join(to_text[b] for b in token)

    ordered = sorted(ranks.items(), key=lambda item: item[1])
    merges = [" ".join(map(spell, _merge_of(tok, rank, ranks))) for tok, rank in ordered if len(tok) > 1]
    encoder = {spell(tok): rank for tok, rank in ordered}
    encoder[EOT_TEXT] = EOT
    return json.dumps(encoder).encode(), ("#version: 0.2\n" + "\n".join(merges) + "\n").encode()


def _ranks_from_whisper() -> tuple[bytes, dict[str, Any]]:
    name, version, sha = WHISPER
    archive = pypi_archive(name, version, sha)
    with tarfile.open(archive) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("whisper/assets/gpt2.tiktoken"))
        data = tar.extractfile(member).read()  # type: ignore[union-attr]
    return data, {"from": f"PyPI {name}=={version} sdist, whisper/assets/gpt2.tiktoken",
                  "archive": archive.name, "archive_sha256": sha}


def _ranks_from_tiktoken() -> tuple[bytes, dict[str, Any]]:
    from tiktoken.load import read_file_cached

    url, sha = URLS["r50k_base.tiktoken"]
    return read_file_cached(url, sha), {"from": url}


def _build(partial: Path, deadline: Deadline) -> tuple[dict[str, Any], dict[str, Any]]:
    errors = []
    for fetch in (_ranks_from_whisper, _ranks_from_tiktoken):
        try:
            data, source = fetch()
            break
        except Exception as exc:  # try the next source; report all if none works
            errors.append(f"{fetch.__name__}: {exc}")
    else:
        raise AssetError("no source of the GPT-2 BPE ranks could be reached: " + "; ".join(errors))
    encoder_json, vocab_bpe = data_gym_files(parse_tiktoken(data))
    contents = {"r50k_base.tiktoken": data, "encoder.json": encoder_json, "vocab.bpe": vocab_bpe}
    for name, (url, sha) in URLS.items():
        if hashlib.sha256(contents[name]).hexdigest() != sha:
            raise AssetError(f"rebuilt {name} does not match tiktoken's sha256 {sha}")
        (partial / "tiktoken").mkdir(exist_ok=True)
        (partial / "tiktoken" / hashlib.sha1(url.encode()).hexdigest()).write_bytes(contents[name])
    (partial / "gpt2.tiktoken").write_bytes(data)
    (partial / "vocab.json").write_bytes(encoder_json)
    (partial / "merges.txt").write_bytes(vocab_bpe)
    config = {"model_max_length": 1024, "tokenizer_class": "GPT2Tokenizer", "add_prefix_space": False,
              "bos_token": EOT_TEXT, "eos_token": EOT_TEXT, "unk_token": EOT_TEXT}
    (partial / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    special = {"bos_token": EOT_TEXT, "eos_token": EOT_TEXT, "unk_token": EOT_TEXT}
    (partial / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    return source, {"vocab_size": VOCAB_SIZE, "merges": vocab_bpe.count(b"\n") - 1}


def gpt2_tokenizer_dir(cache_dir: Path | None = None) -> Path:
    """A folder with the GPT-2 tokenizer files, built once: `GPT2TokenizerFast.from_pretrained(it)` works.

    Its `tiktoken/` subfolder can serve as `TIKTOKEN_CACHE_DIR` for `tiktoken.get_encoding("gpt2")`.
    """
    folder = assets_root(cache_dir) / "tokenizer-gpt2"
    cached_build(folder, what="tokenizer:gpt2", builder_version=BUILDER_VERSION, seed=None, params={},
                 build=_build, label="GPT-2 tokenizer")
    return folder


@functools.cache
def _encoding(folder: Path) -> tiktoken.Encoding:
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    ranks = load_tiktoken_bpe(str(folder / "gpt2.tiktoken"), URLS["r50k_base.tiktoken"][1])
    return tiktoken.Encoding(name="gpt2", pat_str=PAT_STR, mergeable_ranks=ranks,
                             special_tokens={EOT_TEXT: EOT}, explicit_n_vocab=VOCAB_SIZE)


def gpt2_tokenizer(cache_dir: Path | None = None) -> tiktoken.Encoding:
    """GPT-2's tokenizer as a tiktoken Encoding (what `tiktoken.get_encoding("gpt2")` gives), offline."""
    return _encoding(gpt2_tokenizer_dir(cache_dir))


def gpt2_hf_tokenizer(cache_dir: Path | None = None) -> tokenizers.Tokenizer:
    """GPT-2's tokenizer as a Hugging Face `tokenizers.Tokenizer` (the fast tokenizer behind
    `GPT2TokenizerFast`), built from the same files: same ids as `gpt2_tokenizer()`."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    folder = gpt2_tokenizer_dir(cache_dir)
    tok = Tokenizer(models.BPE.from_file(str(folder / "vocab.json"), str(folder / "merges.txt")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken(EOT_TEXT, special=True)])
    return tok
