"""Inspect's entry point: importing this registers openrebench's sandbox and one task per environment."""

from . import use_local_tiktoken_cache  # noqa: F401 - importing the package sets the cache up
from ._sandbox import OpenRebenchSandbox  # noqa: F401
from ._task import environment_tasks

environment_tasks()
