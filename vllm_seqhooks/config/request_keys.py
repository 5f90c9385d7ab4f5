"""Per-request settings: the ``seqhooks_*`` keys of ``SamplingParams.extra_args``
(over HTTP, ``vllm_xargs``), their validation, the keys the engine itself
writes on the requests it makes, and the keys other code registers (pure, no
vLLM import)."""

from __future__ import annotations

from typing import Any, Mapping

from vllm_seqhooks.config import field_checks as check

#: Prefix of every per-request key of this package.
REQUEST_KEY_PREFIX = "seqhooks_"

#: Per-request settings a client may send, each with the check of its value
#: (over HTTP the values of ``vllm_xargs`` must be flat). They can only lower
#: the server's limits.
REQUEST_OVERRIDE_KEYS: dict[str, check.Check] = {
    "seqhooks_enabled": check.loose_flag,
    "seqhooks_merge_separator": check.text(),
    "seqhooks_child_max_tokens": check.integer(1),
    "seqhooks_max_child_depth": check.integer(0),
    "seqhooks_max_children_per_request": check.integer(0),
    "seqhooks_max_family_tokens": check.integer(1),
    "seqhooks_max_descendants": check.integer(0),
    "seqhooks_child_timeout_s": check.seconds(optional=False),
    "seqhooks_family_timeout_s": check.seconds(optional=False),
}

#: Keys the engine writes into the ``extra_args`` of requests it makes: a
#: child's dotted key ("0", "1", "0.1", ...), and on a resumed parent the
#: tokens it sampled before its current output list began; on a request
#: whose positions run behind its token indices (after a splice join, and
#: its later children) that shift (position = index + shift), for logits
#: processors that read positions (V2's ``LogitsContext.pos``).
CHILD_KEY_ARG = "seqhooks_child_key"
SAMPLED_BEFORE_ARG = "seqhooks_sampled_before"
POSITION_SHIFT_ARG = "seqhooks_position_shift"
ENGINE_REQUEST_KEYS = frozenset({CHILD_KEY_ARG, SAMPLED_BEFORE_ARG, POSITION_SHIFT_ARG})

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
    return {
        key[len(REQUEST_KEY_PREFIX):]: REQUEST_OVERRIDE_KEYS[key](key, value)
        for key, value in extra_args.items() if key in REQUEST_OVERRIDE_KEYS
    }
