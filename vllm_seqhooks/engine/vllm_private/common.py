"""What every part of :mod:`vllm_seqhooks.engine.vllm_private` shares."""

from __future__ import annotations

import inspect


class VllmPrivateAPIError(ImportError):
    """The installed vLLM does not match what vllm_seqhooks was built on."""


def method_problems(cls: type, methods: tuple[tuple[str, tuple[str, ...]], ...]) -> list[str]:
    found = []
    for name, params in methods:
        fn = getattr(cls, name, None)
        if fn is None:
            found.append(f"{cls.__name__}.{name} is missing")
            continue
        got = tuple(inspect.signature(fn).parameters)
        if got != params:
            found.append(f"{cls.__name__}.{name}{got} != expected {params}")
    return found


def wrap_method(cls: type, name: str, wrapper, mark: str) -> None:
    """Replace ``cls.<name>`` by ``wrapper``, which carries ``mark`` (so that
    it is installed once) and the method it wraps as ``__wrapped__``."""
    setattr(wrapper, mark, True)
    wrapper.__wrapped__ = getattr(cls, name)
    setattr(cls, name, wrapper)
