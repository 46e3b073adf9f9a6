"""`python -m openrebench.cli`, the same as the `openrebench` command."""

from ._main import main

main()
