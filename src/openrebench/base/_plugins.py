"""Finding plug-ins: the built-in modules of a package and the installed entry points.

Environments, agents and sandbox backends are all found this way: a built-in one is a module of its
package that names itself in a module attribute (`ENVIRONMENT`, `AGENT`, `BACKEND`); a third-party one
is an entry point of the group (`name = "package.module:OBJECT"`). Adding either is one new folder,
file or package and no edit elsewhere; a broken plug-in is skipped with a warning so that the
built-ins still work. The environments' group name lives here too: the registry (runs) loads them
from it, and the sandboxes (isolation) find their code through it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
import re
import warnings
from collections.abc import Callable
from typing import TypeVar

from ._errors import OpenRebenchError

ENVIRONMENT_ENTRY_POINT_GROUP = "openrebench.environments"
T = TypeVar("T")
NAME = re.compile(r"^[a-z][a-z0-9_-]*$")  # what `-T agent=` and `--isolation` take


def check_name(name: object, origin: str, what: str) -> str:
    if not isinstance(name, str) or not NAME.match(name):
        raise OpenRebenchError(f"{origin}: the {what} name {name!r} must be lower case (a-z, 0-9, _ or -)")
    return name


def discover(package: str, attribute: str, group: str, check: Callable[[object, str], T],
             name_of: Callable[[T], str]) -> dict[str, T]:
    """Every plug-in by name, sorted by name: the public modules of `package` (helpers start with `_`;
    a built-in that is wrong is a bug, raised), then the entry points of `group` (one that does not
    load or check, or whose name is taken, is skipped with a warning)."""
    found: dict[str, tuple[T, str]] = {}
    for info in pkgutil.iter_modules(importlib.import_module(package).__path__):
        if info.name.startswith("_"):
            continue
        origin = f"{package}.{info.name}"
        obj = getattr(importlib.import_module(origin), attribute, None)
        if obj is None:
            raise OpenRebenchError(f"{origin} names no {attribute}")
        item = check(obj, origin)
        found[name_of(item)] = (item, origin)
    for ep in importlib.metadata.entry_points(group=group):
        origin = f"the plug-in '{ep.name}' ({ep.value})"
        try:
            item = check(ep.load(), origin)
        except Exception as e:
            warnings.warn(f"openrebench: {origin} is skipped: {type(e).__name__}: {e}", stacklevel=2)
            continue
        name = name_of(item)
        if name in found and found[name][0] is not item:
            warnings.warn(f"openrebench: {origin} is skipped: the name '{name}' is taken by {found[name][1]}",
                          stacklevel=2)
            continue
        found[name] = (item, origin)
    return {name: item for name, (item, _) in sorted(found.items())}


def load_object(path: str, package: str | None = None) -> object:
    """The object an import path names, `module:Qual.Name` (as entry points name theirs; a leading dot in
    the module: relative to `package`)."""
    module, _, name = path.partition(":")
    obj: object = importlib.import_module(module, package)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj
