"""Errors meant for the person at the terminal: the CLI prints them as one line."""


class OpenRebenchError(Exception):
    """A user-facing error (bad input, missing run, unknown environment...)."""
