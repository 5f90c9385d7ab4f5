"""Per-request settings: the ``seqhooks_*`` keys of ``SamplingParams.extra_args``
(over HTTP, ``vllm_xargs``), their validation, and the keys other code
registers (pure, no vLLM import)."""

from __future__ import annotations

from typing import Any, Mapping

from vllm_seqhooks.config import SpecialKwargsError, _check_int, check_seconds

#: Per-request settings, read from ``SamplingParams.extra_args`` (over HTTP:
#: the ``vllm_xargs`` field, whose values must be flat). Key -> minimum value
#: of an integer, or the kind: None for booleans, "text", "seconds".
REQUEST_OVERRIDE_KEYS: dict[str, int | str | None] = {
    "seqhooks_enabled": None,
    "seqhooks_merge_separator": "text",
    "seqhooks_child_max_tokens": 1,
    "seqhooks_max_child_depth": 0,
    "seqhooks_max_children_per_request": 0,
    "seqhooks_max_family_tokens": 1,
    "seqhooks_max_descendants": 0,
    "seqhooks_child_timeout_s": "seconds",
    "seqhooks_family_timeout_s": "seconds",
}


#: Prefix of every per-request key of this package.
REQUEST_KEY_PREFIX = "seqhooks_"
#: ``seqhooks_*`` keys other code in this process reads (a test tool's):
#: accepted in requests, not validated here.
_REGISTERED_REQUEST_KEYS: set[str] = set()


def register_request_keys(*keys: str) -> None:
    """Declare ``seqhooks_*`` request keys that other code reads (e.g. the
    scripted-token test processor), so that requests carrying them are not
    refused as typos."""
    _REGISTERED_REQUEST_KEYS.update(keys)


def unknown_request_keys(
    extra_args: Mapping[str, Any] | None, also_known: frozenset[str] = frozenset()
) -> list[str]:
    """``seqhooks_*`` keys of ``extra_args`` that nothing reads (typos):
    neither a per-request setting, nor registered, nor in ``also_known``."""
    if not extra_args:
        return []
    return sorted(
        k for k in extra_args
        if isinstance(k, str) and k.startswith(REQUEST_KEY_PREFIX)
        and k not in REQUEST_OVERRIDE_KEYS and k not in _REGISTERED_REQUEST_KEYS
        and k not in also_known
    )


def parse_request_overrides(extra_args: Mapping[str, Any] | None) -> dict[str, Any]:
    """Validated per-request settings from ``extra_args`` (keys without the
    ``seqhooks_`` prefix). Raises :class:`SpecialKwargsError` naming the key."""
    if not extra_args:
        return {}
    out: dict[str, Any] = {}
    for key, minimum in REQUEST_OVERRIDE_KEYS.items():
        if key not in extra_args:
            continue
        value = extra_args[key]
        if minimum == "text":
            if not isinstance(value, str):
                raise SpecialKwargsError(f"{key} must be a string, got {value!r}")
        elif minimum == "seconds":
            value = check_seconds(key, value)
        elif minimum is None:
            if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
                value = value.lower() in ("true", "1")
            elif isinstance(value, int) and value in (0, 1):
                value = bool(value)
            if not isinstance(value, bool):
                raise SpecialKwargsError(f"{key} must be true or false, got {value!r}")
        else:
            _check_int(key, value, minimum=minimum)
        out[key[len("seqhooks_"):]] = value
    return out
