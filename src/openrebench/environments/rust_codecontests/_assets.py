"""The problem files of a tier, built once per machine into the asset cache: the validation split the
agent gets (`valid.jsonl`) and the held-out split the scorer reads (`test.jsonl`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from openrebench.api import TierSpec
from openrebench.lm import Deadline, assets_root, cached_build

from .params import RustCodecontestsParams
from .problems import easy_filter, load_codecontests, mini_problems, write_jsonl

BUILDER_VERSION = "1"
SPLITS = ("valid", "test")


def build(spec: TierSpec[RustCodecontestsParams], cache_dir: Path) -> Path:
    """The folder holding the tier's valid.jsonl and test.jsonl."""
    p = spec.params
    folder = assets_root(cache_dir) / f"rcc-{spec.name}-problems"

    def make(partial: Path, deadline: Deadline) -> tuple[dict[str, Any], dict[str, Any]]:
        if p.problems == "mini":
            valid, test = mini_problems(p.problem_seed)
            source = {"generator": "problems.mini_problems", "seed": p.problem_seed}
        else:
            valid, test = easy_filter(load_codecontests("valid")), easy_filter(load_codecontests("test"))
            source = {"dataset": "deepmind/code_contests", "splits": ["valid", "test"],
                      "filter": "easy_filter"}
        write_jsonl(partial / "valid.jsonl", valid)
        write_jsonl(partial / "test.jsonl", test)
        return source, {"valid": len(valid), "test": len(test)}

    cached_build(folder, what=f"problems:rcc-{spec.name}", builder_version=BUILDER_VERSION,
                 seed=p.problem_seed, params={"problems": p.problems}, build=make,
                 label=f"rust_codecontests ({spec.name}): the problems")
    return folder
