"""The `openrebench` command: one module per command group over `_common` (consoles, user errors,
shared options and printing), assembled in `_main`. Command modules never import this package."""

from ._main import app, main

__all__ = ["app", "main"]
