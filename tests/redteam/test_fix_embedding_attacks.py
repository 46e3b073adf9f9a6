"""fix_embedding: the scorer loads the agent's weights; nothing in them may run code or leak held-out data."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
from redteam_support import score_in_process

from openrebench.environments.fix_embedding._assets import model_config
from openrebench.runs import get_environment

ENV = "fix_embedding"


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _protected(tmp_path: Path) -> Path:
    protected = tmp_path / "protected"
    protected.mkdir()
    spec = get_environment(ENV).tier("mini")
    (protected / "model_config.json").write_text(model_config(spec, "large").model_dump_json())
    np.arange(4096 * 8, dtype=np.uint16).tofile(protected / "heldout.bin")
    return protected


@pytest.mark.attack(env=ENV, cls="code in the weights", invariant=3)
def test_pickle_payload_in_model_pt(tmp_path: Path) -> None:
    """A model.pt whose pickle runs a shell command when the scorer loads it."""
    marker = tmp_path / "pwned"
    (tmp_path / "solution" / "fixed_model").mkdir(parents=True)
    with open(tmp_path / "solution" / "fixed_model" / "model.pt", "wb") as f:
        pickle.dump({"transformer.wte.weight": _Payload(marker)}, f)
    result = score_in_process(ENV, tmp_path / "solution", _protected(tmp_path))
    assert not marker.exists(), "attack works: the scorer ran code from the weights"
    assert result.raw is None and result.message.startswith("Invalid: could not read the weights")


@pytest.mark.attack(env=ENV, cls="held-out data in messages", invariant=3)
def test_malformed_safetensors_message_carries_no_heldout(tmp_path: Path) -> None:
    """A truncated safetensors header whose parse error is echoed: nothing of heldout.bin may show."""
    folder = tmp_path / "solution" / "fixed_model"
    folder.mkdir(parents=True)
    header = json.dumps({"x": {"dtype": "F32", "shape": [4096], "data_offsets": [0, 16384]}}).encode()
    (folder / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 10)
    protected = _protected(tmp_path)
    result = score_in_process(ENV, tmp_path / "solution", protected)
    assert result.raw is None
    assert str(protected) not in result.message and "heldout" not in result.message
