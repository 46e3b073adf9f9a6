"""Tamper detection for code that runs beside untrusted solution code in one process.

Before the solution is imported, `TamperGuard` records the identity of everything the measuring
code relies on (timers, synchronisation, tensor methods, its own functions, trace and profile hooks).
`check()` after import and after each call reports the first thing that changed, so a solution that
monkey-patches the clock or the checker gets an invalid score instead of a good one.
"""

from __future__ import annotations

import sys
import threading
import types
from collections.abc import Iterable
from typing import Any

_MISSING = object()


class TamperGuard:
    def __init__(self) -> None:
        self._attrs: list[tuple[str, Any, str, Any]] = []
        self._modules: dict[str, types.ModuleType] = {}
        self._namespaces: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
        self._trace = (sys.gettrace(), sys.getprofile(), threading.gettrace(), threading.getprofile())
        self._monitoring = self._monitoring_tools()
        self._threads = {t.ident for t in threading.enumerate()}

    @staticmethod
    def _monitoring_tools() -> tuple[Any, ...]:
        monitoring = getattr(sys, "monitoring", None)
        if monitoring is None:
            return ()
        return tuple(monitoring.get_tool(i) for i in range(6))

    def watch(self, owner_name: str, owner: Any, names: Iterable[str]) -> TamperGuard:
        """Record `owner.<name>` for each name (functions, classes, methods)."""
        for name in names:
            self._attrs.append((owner_name, owner, name, getattr(owner, name, _MISSING)))
        if isinstance(owner, types.ModuleType):
            self._modules[owner.__name__] = owner
        return self

    def watch_namespace(self, name: str, namespace: dict[str, Any]) -> TamperGuard:
        """Record every binding of a namespace (e.g. the measuring module's own globals)."""
        self._namespaces.append((name, namespace, dict(namespace)))
        return self

    def check(self) -> str | None:
        """A description of the first change seen, or None if everything is as recorded."""
        for owner_name, owner, name, value in self._attrs:
            if getattr(owner, name, _MISSING) is not value:
                return f"{owner_name}.{name} was replaced"
        for name, module in self._modules.items():
            if sys.modules.get(name) is not module:
                return f"module {name} was replaced in sys.modules"
        for label, namespace, saved in self._namespaces:
            for key, value in saved.items():
                if namespace.get(key, _MISSING) is not value:
                    return f"{label}.{key} was replaced"
        now = (sys.gettrace(), sys.getprofile(), threading.gettrace(), threading.getprofile())
        if now != self._trace:
            return "a trace or profile hook was installed"
        if self._monitoring_tools() != self._monitoring:
            return "a sys.monitoring tool was registered"
        return None

    def new_threads(self) -> list[str]:
        """Names of Python threads started since the guard was made that are still alive."""
        return [t.name for t in threading.enumerate() if t.ident not in self._threads and t.is_alive()]
