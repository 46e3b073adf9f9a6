"""The bottom layer, shared by all others: the error type that every layer raises for a one-line
message, where built assets are cached, how many cores a process may use, and the entry-point group of
environment plug-ins."""

from ._errors import OpenRebenchError
from ._paths import cache_dir, usable_cores
from ._plugins import ENVIRONMENT_ENTRY_POINT_GROUP, check_name, discover, load_object

__all__ = [
    "ENVIRONMENT_ENTRY_POINT_GROUP",
    "OpenRebenchError",
    "cache_dir",
    "check_name",
    "discover",
    "load_object",
    "usable_cores",
]
