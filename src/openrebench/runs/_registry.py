"""Which environments exist: the built-in folders and third-party packages, found, never listed.

A built-in environment is a sub-package of `openrebench.environments` whose `__init__` names its
class `ENVIRONMENT`; a third-party one is an entry point in the group `openrebench.environments`
(`name = "package.module:Class"`). Adding either touches nothing else: the CLI, the Inspect tasks,
the scorer process and the analysis all ask this registry.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import pkgutil
import re
import warnings

from openrebench.api import Environment
from openrebench.base import ENVIRONMENT_ENTRY_POINT_GROUP, OpenRebenchError
from openrebench.isolation import forget_plugins

ENTRY_POINT_GROUP = ENVIRONMENT_ENTRY_POINT_GROUP
BUILTIN_PACKAGE = "openrebench.environments"
_ID = re.compile(r"^[a-z][a-z0-9_]*$")  # an Inspect task name and a folder name alike


def _check(cls: object, origin: str) -> type[Environment]:
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise OpenRebenchError(f"{origin} is not an openrebench Environment class")
    env_id = getattr(cls, "id", None)
    if not isinstance(env_id, str) or not _ID.match(env_id):
        raise OpenRebenchError(f"{origin}: the environment id {env_id!r} must be lower_snake_case")
    missing = [a for a in ("rebench_id", "title", "version", "direction", "tiers") if not hasattr(cls, a)]
    if missing:
        raise OpenRebenchError(f"{origin}: the environment class lacks {', '.join(missing)}")
    return cls


def _builtin() -> list[tuple[type[Environment], str]]:
    package = importlib.import_module(BUILTIN_PACKAGE)
    found = []
    for info in pkgutil.iter_modules(package.__path__):
        if not info.ispkg or info.name.startswith("_"):
            continue
        origin = f"{BUILTIN_PACKAGE}.{info.name}"
        cls = getattr(importlib.import_module(origin), "ENVIRONMENT", None)
        if cls is None:
            raise OpenRebenchError(f"{origin} names no ENVIRONMENT class in its __init__")
        found.append((_check(cls, origin), origin))
    return found


def _plugins() -> list[tuple[type[Environment], str]]:
    """Entry points of installed packages; one that cannot be loaded is skipped with a warning, so a
    broken plug-in never takes the built-in environments down with it."""
    found = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        origin = f"the plug-in '{ep.name}' ({ep.value})"
        try:
            found.append((_check(ep.load(), origin), origin))
        except Exception as e:
            warnings.warn(f"openrebench: {origin} is skipped: {type(e).__name__}: {e}", stacklevel=2)
    return found


@functools.cache
def _registry() -> dict[str, tuple[type[Environment], str]]:
    registry: dict[str, tuple[type[Environment], str]] = {}
    for cls, origin in _builtin():
        registry[cls.id] = (cls, origin)
    for cls, origin in _plugins():
        if cls.id in registry and registry[cls.id][0] is not cls:
            warnings.warn(f"openrebench: {origin} is skipped: the id '{cls.id}' is taken by "
                          f"{registry[cls.id][1]}", stacklevel=2)
            continue
        registry[cls.id] = (cls, origin)
    return dict(sorted(registry.items()))


def environment_classes() -> dict[str, type[Environment]]:
    """Every environment by id, sorted by id (built-in and installed plug-ins)."""
    return {env_id: cls for env_id, (cls, _) in _registry().items()}


def environment_ids() -> list[str]:
    return list(_registry())


def get_environment(env: str | Environment) -> Environment:
    """The environment with this id (an Environment passes through), else a one-line error."""
    if isinstance(env, Environment):
        return env
    try:
        return _registry()[env][0]()
    except KeyError:
        raise OpenRebenchError(f"unknown environment '{env}' (known: {', '.join(_registry())})") from None


def refresh() -> None:
    """Forget what was found (after installing a plug-in in a running process, as tests do)."""
    _registry.cache_clear()
    forget_plugins()
