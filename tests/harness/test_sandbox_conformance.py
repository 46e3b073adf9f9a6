"""Inspect's conformance checks for sandbox providers, run against every backend of ours.

The checks are Inspect's own (`inspect_ai.util._sandbox.self_check`), pulled in unchanged; this module
only provides the `sandbox_env` fixture they ask for and marks the exceptions a backend documents
(docs/evaluating.md, "Sandboxes"), each with its reason. An exception is a check that cannot hold by
design, and then the call fails loudly (SandboxUserUnsupportedError), never silently.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest
from inspect_ai.util._sandbox.self_check import *  # noqa: F403 - the checks, collected here

from openrebench.harness import OpenRebenchSandbox, SandboxConfig
from openrebench.isolation import bwrap_binary
from openrebench.runs import Run, start_run

pytestmark = pytest.mark.anyio

# Checks that cannot hold, by backend, with why (also in docs/evaluating.md).
EXCEPTIONS = {
    "bwrap": {
        "test_exec_as_user": "one user per attempt: no root and no other users to switch to (the call raises "
                             "SandboxUserUnsupportedError)",
    },
    "none": {
        "test_exec_as_user": "one user: the harness's (the call raises SandboxUserUnsupportedError)",
    },
}
if os.geteuid() == 0:  # with no isolation, a root harness's commands run as root: permissions do not stop it
    for check in ("test_read_file_not_allowed", "test_write_text_file_without_permissions",
                  "test_write_binary_file_without_permissions"):
        EXCEPTIONS["none"][check] = "no isolation: run as root, the agent ignores file permissions"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def conformance_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return start_run("optimize_kernel", "mini", tmp_path_factory.mktemp("conformance") / "run",
                     score_start=False)[0]


@pytest.fixture(params=["bwrap", "none"])
async def sandbox_env(request: pytest.FixtureRequest,
                      conformance_run: Run) -> AsyncIterator[OpenRebenchSandbox]:
    backend = request.param
    if backend == "bwrap" and bwrap_binary() is None:
        pytest.skip("bubblewrap is not available")
    reason = EXCEPTIONS[backend].get(request.node.originalname)
    if reason:
        request.node.add_marker(pytest.mark.xfail(reason=reason, strict=True))
    box = await OpenRebenchSandbox.for_run(conformance_run, SandboxConfig(env_id="optimize_kernel",
                                                                           isolation=backend))
    try:
        yield box
    finally:
        await box.close()


def test_every_check_of_inspect_is_collected() -> None:
    """The star import brought Inspect's checks in (a renamed module would silently run none)."""
    ours = {"test_every_check_of_inspect_is_collected", "test_the_exceptions_name_real_checks"}
    checks = [name for name in globals() if name.startswith("test_") and name not in ours]
    assert len(checks) >= 40, checks


def test_the_exceptions_name_real_checks() -> None:
    for backend in EXCEPTIONS.values():
        for check in backend:
            assert check in globals(), f"{check} is not one of Inspect's checks (renamed upstream?)"
