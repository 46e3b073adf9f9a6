"""Reading Hugging Face model folders without running their code, and comparing weights by L1 distance.

Only safetensors files are read (a single `model.safetensors` or shards listed in
`model.safetensors.index.json`), one tensor at a time, so that comparing three copies of a large model
needs little memory. `lm_head.weight` is GPT-2's tied copy of `transformer.wte.weight` and is ignored.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from pydantic import BaseModel
from safetensors import safe_open

TIED = "lm_head.weight"
ARCHITECTURE_KEYS = ("model_type", "vocab_size", "n_positions", "n_embd", "n_layer", "n_head")


class WeightsError(Exception):
    """The folder does not hold a readable model of the expected architecture; the message says why."""


class Distances(BaseModel):
    """L1 distances (sums of absolute differences over every parameter) between three sets of weights."""

    agent_reference: float
    reference_initial: float
    agent_initial: float
    max_abs_agent_reference: float
    parameters: int

    @property
    def relative(self) -> float:
        """The agent's distance from the reference run, as a share of the reference run's own update."""
        return self.agent_reference / self.reference_initial if self.reference_initial else float("inf")


def tensor_files(folder: Path) -> dict[str, Path]:
    """Parameter name -> the safetensors file holding it."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            return {name: folder / file for name, file in weight_map.items() if "/" not in file}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise WeightsError(f"{folder.name}/{index.name} is not a valid index ({e})") from None
    single = folder / "model.safetensors"
    if not single.is_file():
        raise WeightsError(f"{folder.name}/ has no model.safetensors (save it with save_pretrained)")
    try:
        with safe_open(single, framework="pt") as f:
            return {name: single for name in f.keys()}  # noqa: SIM118 - safe_open has no __iter__
    except Exception as e:  # a truncated or foreign file
        raise WeightsError(f"{folder.name}/model.safetensors cannot be read ({type(e).__name__}: "
                           f"{str(e)[:200]})") from None


def read_config(folder: Path) -> dict[str, object]:
    try:
        config = json.loads((folder / "config.json").read_text())
    except FileNotFoundError:
        raise WeightsError(f"{folder.name}/ has no config.json") from None
    except ValueError as e:
        raise WeightsError(f"{folder.name}/config.json is not valid JSON ({e})") from None
    if not isinstance(config, dict):
        raise WeightsError(f"{folder.name}/config.json is not a JSON object")
    return config


class Weights:
    """A model folder's parameters, read lazily by name."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.config = read_config(folder)
        self.files = {k: v for k, v in tensor_files(folder).items() if k != TIED}
        self._handles: dict[Path, object] = {}

    def __getitem__(self, name: str) -> torch.Tensor:
        path = self.files[name]
        if path not in self._handles:
            try:
                self._handles[path] = safe_open(path, framework="pt")
            except Exception as e:
                raise WeightsError(f"{self.folder.name}/{path.name} cannot be read ({type(e).__name__})") \
                    from None
        try:
            return self._handles[path].get_tensor(name)  # type: ignore[attr-defined]
        except Exception as e:
            raise WeightsError(f"{self.folder.name}: parameter {name} cannot be read "
                               f"({type(e).__name__}: {str(e)[:200]})") from None

    def shapes(self) -> dict[str, tuple[int, ...]]:
        shapes = {}
        for path in sorted(set(self.files.values())):
            with safe_open(path, framework="pt") as f:
                for name in f.keys():  # noqa: SIM118
                    if name in self.files:
                        shapes[name] = tuple(f.get_slice(name).get_shape())
        return shapes


def check_architecture(agent: Weights, initial: Weights) -> str | None:
    """Why the agent's model is not the initial model's architecture, or None. In the initial model's
    terms only (its keys, its parameter names, counts): the agent's files were written by a pipeline that
    read the scoring's held-out records, so none of their text (a value, a name) is quoted back."""
    for key in ARCHITECTURE_KEYS:
        if agent.config.get(key) != initial.config.get(key):
            return f"config.json's {key} is not the initial model's ({initial.config.get(key)!r})"
    want, got = initial.shapes(), agent.shapes()
    missing, extra = sorted(set(want) - set(got)), set(got) - set(want)
    if missing or extra:
        return (f"parameters differ from the model's: {len(missing)} missing (first {missing[:3]}), "
                f"{len(extra)} not the model's")
    for name, shape in want.items():
        if got[name] != shape:
            return f"{name} does not have the model's shape {list(shape)}"
    return None


def distances(agent: Weights, reference: Weights, initial: Weights) -> Distances:
    """L1 distances in float32, summed in float64; raises WeightsError on a non-float or non-finite value."""
    totals = torch.zeros(3, dtype=torch.float64)
    worst, count = 0.0, 0
    for name in sorted(initial.files):
        a = agent[name]
        if not torch.is_floating_point(a):
            raise WeightsError(f"{name} is not a floating-point tensor ({a.dtype})")
        a = a.float()
        if not torch.isfinite(a).all():
            raise WeightsError(f"{name} has NaN or infinite values")
        r, i = reference[name].float(), initial[name].float()
        diff = (a - r).abs()
        totals += torch.stack([diff.sum(dtype=torch.float64), (r - i).abs().sum(dtype=torch.float64),
                               (a - i).abs().sum(dtype=torch.float64)])
        worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
        count += a.numel()
    return Distances(agent_reference=float(totals[0]), reference_initial=float(totals[1]),
                     agent_initial=float(totals[2]), max_abs_agent_reference=worst, parameters=count)


def unchanged(agent: Weights, initial: Weights) -> bool:
    """True when every parameter equals the initial one (no training happened)."""
    return all(torch.equal(agent[name].float(), initial[name].float()) for name in initial.files)
