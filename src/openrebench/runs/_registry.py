"""Which environments exist: the built-in folders and third-party packages, found, never listed.

A built-in environment is a sub-package of `openrebench.environments` whose `__init__` names its
class `ENVIRONMENT`; a third-party one is an entry point in the group `openrebench.environments`
(`name = "package.module:Class"`). Adding either touches nothing else: the CLI, the Inspect tasks,
the scorer process and the analysis all ask this registry.
"""

from __future__ import annotations

import functools
import re

from openrebench.api import Environment
from openrebench.base import ENVIRONMENT_ENTRY_POINT_GROUP, OpenRebenchError, discover, load_object
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
    if cls.scorer is None and cls.score is Environment.score:
        raise OpenRebenchError(f"{origin}: the environment class names no scorer (set `scorer = "
                               "\"module:function\"` or override `score`)")
    return cls


@functools.cache
def _registry() -> dict[str, type[Environment]]:
    return discover(BUILTIN_PACKAGE, "ENVIRONMENT", ENTRY_POINT_GROUP, _check, lambda cls: cls.id)


def environment_classes() -> dict[str, type[Environment]]:
    """Every environment by id, sorted by id (built-in and installed plug-ins)."""
    return dict(_registry())


def environment_ids() -> list[str]:
    return list(_registry())


def get_environment(env: str | Environment) -> Environment:
    """The environment with this id (an Environment passes through), else a one-line error."""
    if isinstance(env, Environment):
        return env
    try:
        return _registry()[env]()
    except KeyError:
        raise OpenRebenchError(f"unknown environment '{env}' (known: {', '.join(_registry())})") from None


def class_path(env: str | Environment) -> str:
    """Where the environment's class lives, `module:QualName`: what a scorer process imports to load this
    one environment alone (`by_class_path`), instead of discovering every installed one. An Environment
    names its own class: the registry is asked only for an id."""
    cls = type(env if isinstance(env, Environment) else get_environment(env))
    return f"{cls.__module__}:{cls.__qualname__}"


def by_class_path(path: str, env_id: str) -> Environment:
    """The environment whose class `class_path` named, checked to be an Environment with id `env_id`."""
    cls = _check(load_object(path), path)
    if cls.id != env_id:
        raise OpenRebenchError(f"{path} is the environment '{cls.id}', not '{env_id}'")
    return cls()


def refresh() -> None:
    """Forget what was found (after installing a plug-in in a running process, as tests do)."""
    _registry.cache_clear()
    forget_plugins()
