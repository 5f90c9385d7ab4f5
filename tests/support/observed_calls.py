"""Wrap an in-process engine's scheduler calls from outside, for tests and
benchmarks that count or time them.

The hook scheduler binds vLLM's own step methods on itself while no
fork/join work is in flight (``SeqHooksMixin.PLAIN_BOUND``), and takes them
back when work starts: a wrapper set on the scheduler instance would be
replaced, and a method captured once would miss the change. The engine core
reaches its scheduler through ``EngineCore.scheduler`` at every call, so the
wrappers sit there: :func:`observe_calls` puts an :class:`ObservedCalls` in
its place, which looks each wrapped method up on the scheduler at every call.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from tests.support.forkjoin import engine_core_of


class ObservedCalls:
    """``scheduler`` with ``wrappers[name](method, *args, **kwargs)`` run in
    place of ``scheduler.name(*args, **kwargs)`` (``method``: the scheduler's
    own at the time of the call); every other attribute is the scheduler's,
    read and written through."""

    def __init__(self, scheduler: Any, wrappers: dict[str, Callable[..., Any]]) -> None:
        object.__setattr__(self, "_scheduler", scheduler)
        object.__setattr__(self, "_wrappers", wrappers)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._scheduler, name)
        wrapper = self._wrappers.get(name)
        return value if wrapper is None else functools.partial(wrapper, value)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._scheduler, name, value)


def observe_calls(llm: Any, **wrappers: Callable[..., Any]) -> ObservedCalls:
    """Wrap the scheduler calls of ``llm``'s in-process engine core: each
    keyword names a scheduler method and gives ``wrapper(method, *args,
    **kwargs)``."""
    core = engine_core_of(llm)
    core.scheduler = ObservedCalls(core.scheduler, wrappers)
    return core.scheduler
