"""Stage 1 of finetune.sh: tokenise the prompt/response records of a JSON-lines file into token shards.

A record {"prompt": p, "response": r} becomes the token ids of p, then of r, then <eos>, cut to
max_seq_len (the response is cut, never the prompt). The trainer computes the loss on the response
tokens only; `prompt_lengths` records where they start.

    python convert_finetuning_dataset.py --config finetune.yaml --data finetune_data.jsonl --out tokens/train
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from transformers import AutoTokenizer

_tokenizer: Any = None
_settings: dict[str, Any] = {}


def _init_worker(tokenizer_name: str, settings: dict[str, Any]) -> None:
    global _tokenizer, _settings
    _tokenizer = AutoTokenizer.from_pretrained(tokenizer_name)
    _settings = settings


def tokenize(record: dict[str, str]) -> tuple[list[int], int]:
    """(token ids, prompt length) of one record."""
    prompt = _tokenizer(record[_settings["prompt_key"]], add_special_tokens=False)["input_ids"]
    response = _tokenizer(record[_settings["response_key"]], add_special_tokens=False)["input_ids"]
    ids = (prompt + response + [_tokenizer.eos_token_id])[: _settings["max_seq_len"]]
    if len(prompt) >= len(ids):
        raise ValueError(f"a prompt of {len(prompt)} tokens leaves no response within max_seq_len")
    return ids, len(prompt)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    cfg = yaml.safe_load(Path(args.config).read_text())
    data = cfg["data"]
    settings = {"prompt_key": data.get("prompt_key", "prompt"),
                "response_key": data.get("response_key", "response"), "max_seq_len": cfg["max_seq_len"]}
    with open(args.data) as f:
        records = [json.loads(line) for line in f if line.strip()]
    workers = max(1, int(data.get("num_proc", 1)))
    with mp.Pool(workers, initializer=_init_worker, initargs=(cfg["tokenizer"]["name"], settings)) as pool:
        rows = pool.map(tokenize, records, chunksize=max(1, len(records) // (4 * workers)))

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lengths = np.array([len(ids) for ids, _ in rows], dtype=np.int64)
    np.savez(out / "shard-00000.npz",
             tokens=np.concatenate([np.asarray(ids, dtype=np.int32) for ids, _ in rows]),
             offsets=np.concatenate([[0], np.cumsum(lengths)]),
             prompt_lengths=np.array([p for _, p in rows], dtype=np.int64))
    (out / "index.json").write_text(json.dumps({"shards": ["shard-00000.npz"], "samples": len(rows),
                                                "tokens": int(lengths.sum())}) + "\n")
    print(f"tokenised {len(rows)} records ({int(lengths.sum())} tokens) into {out}")


if __name__ == "__main__":
    main()
