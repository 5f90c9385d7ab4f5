"""Run a function right after a module is imported (or now, if it already is).

The ``vllm.general_plugins`` entry point runs in every vLLM process, early,
and must stay cheap there: importing vLLM's frontend modules just to patch
them would cost every worker process about a second. :func:`when_imported`
defers the patch to the moment the module is imported, in the processes
that import it.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading
from typing import Callable

_pending: dict[str, list[Callable[[], None]]] = {}
_lock = threading.Lock()


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the loader of the watched modules so callbacks run after them."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _pending:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        original_exec = loader.exec_module

        def exec_module(module):
            original_exec(module)
            _run(fullname)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


_finder = _Finder()


def _run(name: str) -> None:
    with _lock:
        callbacks = _pending.pop(name, [])
        if not _pending and _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
    for callback in callbacks:
        callback()


def when_imported(module_name: str, callback: Callable[[], None]) -> None:
    """Call ``callback()`` once ``module_name`` is imported: now if it is
    already in ``sys.modules``, else right after its import completes."""
    if module_name in sys.modules:
        callback()
        return
    with _lock:
        _pending.setdefault(module_name, []).append(callback)
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
