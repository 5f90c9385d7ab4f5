"""Checks of one setting's value, shared by :class:`SpecialKwargs` fields and
per-request keys (pure, no vLLM import).

Each factory returns a check ``(name, value) -> value``: it returns the value
(normalised: a tuple for a list of ids, a float for seconds) or raises
:class:`SpecialKwargsError` naming the setting. A check's ``kind`` says what
it accepts ("int", "token_id", "token_ids", "text", "choice", "seconds",
"bool"); an integer check also has its ``minimum``.
"""

from __future__ import annotations

import difflib
import math
import os
from typing import Any, Callable, Iterable

Check = Callable[[str, Any], Any]


class SpecialKwargsError(ValueError):
    """A sequence-hook setting is invalid. The message names the field."""


def unknown_fields_message(unknown: Iterable[str], known: Iterable[str], *,
                           what: str = "special_kwargs field(s)",
                           known_as: str = "known fields") -> str:
    """``unknown {what}: ...; {known_as}: ...``: names the unknown names, the
    nearest known one of each where one is close, and all known names (the
    one "did you mean" of special_kwargs fields, seqhooks.json keys and
    per-request keys)."""
    known = sorted(known)
    # (compared without the prefix all known names share: "seqhooks_")
    prefix = os.path.commonprefix(known) if len(known) > 1 else ""
    bare = {k[len(prefix):]: k for k in known}
    parts = []
    for name in sorted(unknown):
        # a name cut short ("max_children") means the one it starts, when one does
        longer = [k for k in known if k.startswith(name)]
        close = difflib.get_close_matches(name.removeprefix(prefix), list(bare), n=1)
        near = longer if len(longer) == 1 else [bare[c] for c in close]
        parts.append(f"{name!r} (did you mean {near[0]!r}?)" if near else repr(name))
    return f"unknown {what}: {', '.join(parts)}; {known_as}: {', '.join(known)}"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(kind: str, **attrs: Any) -> Callable[[Check], Check]:
    def mark(check: Check) -> Check:
        check.kind = kind  # type: ignore[attr-defined]
        for name, value in attrs.items():
            setattr(check, name, value)
        return check
    return mark


def integer(minimum: int, *, optional: bool = False) -> Check:
    @_kind("int", minimum=minimum)
    def check(name: str, value: Any) -> Any:
        if value is None and optional:
            return None
        if not _is_int(value):
            raise SpecialKwargsError(
                f"{name} must be an integer, got {value!r} ({type(value).__name__})")
        if value < minimum:
            raise SpecialKwargsError(f"{name} must be >= {minimum}, got {value}")
        return value
    return check


@_kind("token_id")
def token_id(name: str, value: Any) -> Any:
    """An optional token id (``None`` or an integer >= 0)."""
    if value is None:
        return None
    if not _is_int(value):
        raise SpecialKwargsError(
            f"{name} must be an integer token id, got {value!r} ({type(value).__name__})")
    if value < 0:
        raise SpecialKwargsError(f"{name} must be >= 0, got {value}")
    return value


@_kind("token_ids")
def token_ids(name: str, value: Any) -> Any:
    """An optional list of token ids, kept as a tuple."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not all(_is_int(v) and v >= 0 for v in value):
        raise SpecialKwargsError(f"{name} must be a list of non-negative token ids, got {value!r}")
    return tuple(value)


def text(*, optional: bool = False, non_empty: bool = False) -> Check:
    @_kind("text")
    def check(name: str, value: Any) -> Any:
        if value is None and optional:
            return None
        if not isinstance(value, str) or (non_empty and not value):
            what = "a non-empty token string" if non_empty else "a string"
            raise SpecialKwargsError(f"{name} must be {what}, got {value!r}")
        return value
    return check


def choice(options: tuple[str, ...]) -> Check:
    @_kind("choice", options=options)
    def check(name: str, value: Any) -> Any:
        if value not in options:
            raise SpecialKwargsError(f"{name} must be one of {options}, got {value!r}")
        return value
    return check


def seconds(*, optional: bool = True) -> Check:
    """A time limit in seconds: a finite number > 0 (a float)."""
    @_kind("seconds")
    def check(name: str, value: Any) -> Any:
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SpecialKwargsError(
                f"{name} must be a number of seconds, got {value!r} ({type(value).__name__})")
        if not math.isfinite(value) or value <= 0:
            raise SpecialKwargsError(f"{name} must be a finite number > 0, got {value!r}")
        return float(value)
    return check


@_kind("bool")
def flag(name: str, value: Any) -> Any:
    """True or false."""
    if not isinstance(value, bool):
        raise SpecialKwargsError(f"{name} must be true or false, got {value!r}")
    return value


@_kind("bool")
def loose_flag(name: str, value: Any) -> Any:
    """True or false, also written as "true"/"false"/"1"/"0" or 0/1 (the
    flat values of an HTTP request's ``vllm_xargs``)."""
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
        value = value.lower() in ("true", "1")
    elif _is_int(value) and value in (0, 1):
        value = bool(value)
    return flag(name, value)
