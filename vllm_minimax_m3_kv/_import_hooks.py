"""Run a callback right after a module is first imported.

Lets the plugin patch a vLLM model module without importing it at plugin load:
load stays cheap, and processes that never build MiniMax-M3 never import it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

Callback = Callable[[ModuleType], None]


class _CallbackLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, callbacks: list[Callback]) -> None:
        self._loader = loader
        self._callbacks = callbacks

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        for callback in self._callbacks:
            callback(module)
        # The last awaited module has come: the finder leaves the import path
        # (here, not in find_spec, where the import system is iterating it).
        _finder.leave_when_done()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self._pending: dict[str, list[Callback]] = {}
        self._lock = threading.Lock()

    def add(self, module_name: str, callback: Callback) -> None:
        with self._lock:
            self._pending.setdefault(module_name, []).append(callback)
            if self not in sys.meta_path:
                sys.meta_path.insert(0, self)

    def leave_when_done(self) -> None:
        with self._lock:
            if not self._pending and self in sys.meta_path:
                sys.meta_path.remove(self)

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        with self._lock:
            callbacks = self._pending.pop(fullname, None)
        if callbacks is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _CallbackLoader(spec.loader, callbacks)
                return spec
        return None


_finder = _PostImportFinder()


def when_imported(module_name: str, callback: Callback) -> None:
    """Call ``callback(module)`` once ``module_name`` is imported (now if it is)."""
    module = sys.modules.get(module_name)
    if module is not None:
        callback(module)
        return
    _finder.add(module_name, callback)
