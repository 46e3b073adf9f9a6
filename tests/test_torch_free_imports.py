"""What a CPU scoring's own process imports: optimize_kernel's CPU scorer and scaling_law's scorer never
import torch (each import costs a scoring about 2 s of CPU, and torch's threads left spinning likely
slowed the kernel's timed calls), and openrebench.lm imports a name's module only when the name is first
used."""

from __future__ import annotations

import subprocess
import sys

import openrebench.lm as lm

CPU_SCORING = """
import os, sys
import numpy as np
from openrebench.environments.optimize_kernel import scorer
from openrebench.environments.optimize_kernel._buffers import CpuInput
from openrebench.environments.optimize_kernel._inputs import expected_array, fresh_array
from openrebench.environments.scaling_law import scorer as scaling_scorer
from openrebench.lm import gcide_root, load_corpus

a = fresh_array(1000, -10, 11)
fd = os.memfd_create("input")
os.ftruncate(fd, 4 * a.size)
buffer = CpuInput(fd, a.size)
np.copyto(buffer.array, a)
assert np.array_equal(buffer.array, a) and expected_array(buffer.array).dtype == np.int32
buffer.close()
print("torch" in sys.modules)
"""


def test_a_cpu_scorings_own_process_never_imports_torch() -> None:
    out = subprocess.run([sys.executable, "-c", CPU_SCORING], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


def test_every_name_of_the_lm_package_resolves_and_is_listed() -> None:
    missing = [name for name in lm.__all__ if not hasattr(lm, name)]
    assert not missing, missing
    assert set(lm._LAZY) <= set(lm.__all__) <= set(dir(lm))
    assert lm.GPT.__module__ == "openrebench.lm._model"  # the name's own module, not a stand-in
