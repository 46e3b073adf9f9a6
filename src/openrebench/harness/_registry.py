"""Inspect's entry point: importing this registers openrebench's tasks and sandbox."""

from ._sandbox import OpenRebenchSandbox  # noqa: F401
from ._task import optimize_kernel  # noqa: F401
