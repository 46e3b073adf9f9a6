"""Inspect's entry point: importing this registers openrebench's tasks and sandbox."""

from . import use_local_tiktoken_cache  # noqa: F401 - importing the package sets the cache up
from ._sandbox import OpenRebenchSandbox  # noqa: F401
from ._task import optimize_kernel  # noqa: F401
