"""The bottom layer, shared by all others: the error type that every layer raises for a one-line
message, and where built assets are cached."""

from ._errors import OpenRebenchError
from ._paths import cache_dir

__all__ = ["OpenRebenchError", "cache_dir"]
