"""`SpecialKwargs`: the configuration of sequence hooks.

Pure Python, no vLLM import. Validation happens at construction (errors name
the field and the bad value); token strings and text fields are turned into
token ids by :meth:`SpecialKwargs.resolve` once a tokenizer is known. The
object round-trips through JSON, which is how it travels to the scheduler in
EngineCore (``additional_config["seqhooks"]``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

#: Key under which the configuration travels in vLLM's ``additional_config``.
ADDITIONAL_CONFIG_KEY = "seqhooks"
#: The ``worker_extension_cls`` of engines with hooks: vLLM imports it in
#: each worker process, which installs the family batch order there.
WORKER_EXTENSION_QUALNAME = "vllm_seqhooks.worker.SeqHooksWorkerExtension"

CHILD_CONTEXTS = ("fork", "payload")
MERGE_STRATEGIES = ("concatenate", "none")
BATCH_ORDERS = ("family", "arrival")
PAYLOAD_PLACEHOLDER = "{payload}"


class SpecialKwargsError(ValueError):
    """A sequence-hook setting is invalid. The message names the field."""


def _check_token_id(name: str, value: Any, *, optional: bool) -> None:
    if value is None:
        if optional:
            return
        raise SpecialKwargsError(f"{name} is required (got None)")
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecialKwargsError(
            f"{name} must be an integer token id, got {value!r} "
            f"({type(value).__name__})"
        )
    if value < 0:
        raise SpecialKwargsError(f"{name} must be >= 0, got {value}")


def _check_int(name: str, value: Any, *, minimum: int, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecialKwargsError(
            f"{name} must be an integer, got {value!r} ({type(value).__name__})"
        )
    if value < minimum:
        raise SpecialKwargsError(f"{name} must be >= {minimum}, got {value}")


def check_seconds(name: str, value: Any) -> float:
    """A time limit in seconds: a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecialKwargsError(
            f"{name} must be a number of seconds, got {value!r} ({type(value).__name__})"
        )
    if not math.isfinite(value) or value <= 0:
        raise SpecialKwargsError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _check_ids(name: str, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    ):
        raise SpecialKwargsError(
            f"{name} must be a list of non-negative token ids, got {value!r}"
        )


@dataclass(frozen=True)
class SpecialKwargs:
    """Sequence-hook settings.

    Give each hook token either as an id (``sync_token_id=``) or as a token
    string (``sync_token="<sync>"``) that :meth:`resolve` turns into an id
    through the model's tokenizer. The README's configuration table gives
    the meaning of every field.
    """

    sync_token_id: int | None = None
    promise_token_id: int | None = None
    promise_end_token_id: int | None = None
    sync_token: str | None = None
    promise_token: str | None = None
    promise_end_token: str | None = None
    child_context: str = "fork"
    child_prompt_template: str | None = None
    merge_strategy: str = "concatenate"
    merge_separator: str = "\n"
    max_child_depth: int = 1
    max_children_per_request: int = 16
    child_max_tokens: int | None = None
    failed_child_marker: str | None = None
    batch_order: str = "family"
    # Limits of a request's family (vllm_seqhooks.family) and fair share.
    family_token_factor: int | None = None
    max_descendants: int = 256
    max_live_children_per_family: int = 64
    max_live_children: int = 1024
    child_timeout_s: float | None = None
    family_timeout_s: float | None = None
    fair_share: bool = True
    # A format written in text tags (vllm_seqhooks.formats.TagFormat): set
    # fork_tag instead of the promise / sync tokens.
    fork_tag: str | None = None
    outline_tag: str | None = None
    fork_count: int | None = None
    child_header: str = ""
    header_lead: str = ""
    child_end_tag: str | None = None
    child_eos_text: str | None = None
    merge_suffix: str = ""
    fork_min_tokens: int | None = None
    # Filled in by resolve(); part of the JSON form so that the engine does not
    # need to tokenize again.
    merge_separator_token_ids: tuple[int, ...] | None = field(default=None)
    failed_child_marker_token_ids: tuple[int, ...] | None = field(default=None)
    child_prompt_prefix_token_ids: tuple[int, ...] | None = field(default=None)
    child_prompt_suffix_token_ids: tuple[int, ...] | None = field(default=None)

    def __post_init__(self) -> None:
        if self.fork_tag is not None:
            self._check_tag_format()
        for name in ("sync", "promise"):
            tid = getattr(self, f"{name}_token_id")
            tok = getattr(self, f"{name}_token")
            if tid is None and tok is None and self.fork_tag is None:
                raise SpecialKwargsError(
                    f"{name}_token_id is required (or give {name}_token as a "
                    f"token string, or a fork_tag for a tag format)"
                )
        for name in ("sync_token_id", "promise_token_id", "promise_end_token_id"):
            _check_token_id(name, getattr(self, name), optional=True)
        for name in ("sync_token", "promise_token", "promise_end_token"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise SpecialKwargsError(
                    f"{name} must be a non-empty token string, got {value!r}"
                )
        ids = {
            name: getattr(self, name)
            for name in ("sync_token_id", "promise_token_id", "promise_end_token_id")
            if getattr(self, name) is not None
        }
        seen: dict[int, str] = {}
        for name, tid in ids.items():
            if tid in seen:
                raise SpecialKwargsError(
                    f"{name} and {seen[tid]} must differ, both are {tid}"
                )
            seen[tid] = name
        if self.child_context not in CHILD_CONTEXTS:
            raise SpecialKwargsError(
                f"child_context must be one of {CHILD_CONTEXTS}, "
                f"got {self.child_context!r}"
            )
        if self.child_prompt_template is not None:
            if not isinstance(self.child_prompt_template, str):
                raise SpecialKwargsError(
                    f"child_prompt_template must be a string, got "
                    f"{self.child_prompt_template!r}"
                )
            if self.child_context != "payload":
                raise SpecialKwargsError(
                    "child_prompt_template is only used with "
                    "child_context='payload', got child_context="
                    f"{self.child_context!r}"
                )
            if self.child_prompt_template.count(PAYLOAD_PLACEHOLDER) != 1:
                raise SpecialKwargsError(
                    f"child_prompt_template must contain {PAYLOAD_PLACEHOLDER} "
                    f"exactly once, got {self.child_prompt_template!r}"
                )
        if self.merge_strategy not in MERGE_STRATEGIES:
            raise SpecialKwargsError(
                f"merge_strategy must be one of {MERGE_STRATEGIES}, "
                f"got {self.merge_strategy!r}"
            )
        if self.batch_order not in BATCH_ORDERS:
            raise SpecialKwargsError(
                f"batch_order must be one of {BATCH_ORDERS}, got {self.batch_order!r}"
            )
        if not isinstance(self.merge_separator, str):
            raise SpecialKwargsError(
                f"merge_separator must be a string, got {self.merge_separator!r}"
            )
        if self.failed_child_marker is not None and not isinstance(
            self.failed_child_marker, str
        ):
            raise SpecialKwargsError(
                f"failed_child_marker must be a string or None, got "
                f"{self.failed_child_marker!r}"
            )
        _check_int("max_child_depth", self.max_child_depth, minimum=0)
        _check_int("max_children_per_request", self.max_children_per_request, minimum=0)
        _check_int("child_max_tokens", self.child_max_tokens, minimum=1, optional=True)
        _check_int("family_token_factor", self.family_token_factor, minimum=1, optional=True)
        _check_int("max_descendants", self.max_descendants, minimum=0)
        _check_int("max_live_children_per_family", self.max_live_children_per_family, minimum=1)
        _check_int("max_live_children", self.max_live_children, minimum=1)
        for name in ("child_timeout_s", "family_timeout_s"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, check_seconds(name, value))
        if not isinstance(self.fair_share, bool):
            raise SpecialKwargsError(
                f"fair_share must be true or false, got {self.fair_share!r}")
        for name in (
            "merge_separator_token_ids",
            "failed_child_marker_token_ids",
            "child_prompt_prefix_token_ids",
            "child_prompt_suffix_token_ids",
        ):
            value = getattr(self, name)
            _check_ids(name, value)
            if value is not None:
                object.__setattr__(self, name, tuple(value))

    def _check_tag_format(self) -> None:
        for name in ("sync", "promise", "promise_end"):
            if getattr(self, f"{name}_token") is not None or getattr(
                    self, f"{name}_token_id") is not None:
                raise SpecialKwargsError(
                    f"fork_tag (a tag format, joined when the children end) and "
                    f"{name}_token cannot be combined; use one or the other")
        from vllm_seqhooks.formats import TagFormatError

        try:
            self.tag_format
        except TagFormatError as exc:
            raise SpecialKwargsError(str(exc)) from None

    @functools.cached_property
    def tag_format(self):
        """The :class:`~vllm_seqhooks.formats.TagFormat` made of this
        object's fields of the same names (None: the promise / sync
        protocol); built once."""
        if self.fork_tag is None:
            return None
        from vllm_seqhooks.formats import TagFormat

        return TagFormat(**{f.name: getattr(self, f.name) for f in fields(TagFormat)})

    def summary(self) -> str:
        """One line for the engine's log."""
        fmt = self.tag_format
        if fmt is not None:
            how = (f"outline items {fmt.outline_tag!r}" if fmt.outline_tag
                   else f"{fmt.fork_count} children")
            hooks = (f"fork at {fmt.fork_tag!r} ({how}), children end at "
                     f"{fmt.child_end_tag!r}, merge suffix {fmt.merge_suffix!r}")
        else:
            hooks = (f"sync={self.sync_token_id} promise={self.promise_token_id} "
                     f"promise_end={self.promise_end_token_id} context={self.child_context} "
                     f"merge={self.merge_strategy}")
        return (f"{hooks} max_child_depth={self.max_child_depth} "
                f"max_children_per_request={self.max_children_per_request}")

    # ------------------------------------------------------------------ ids
    @property
    def hook_token_ids(self) -> frozenset[int]:
        """The ids that drive hooks (known only once resolved)."""
        return frozenset(
            t
            for t in (self.sync_token_id, self.promise_token_id, self.promise_end_token_id)
            if t is not None
        )

    @property
    def is_resolved(self) -> bool:
        """True when every id the engine needs is known."""
        return (
            (self.fork_tag is not None or (
                self.sync_token_id is not None and self.promise_token_id is not None))
            and (self.promise_end_token is None or self.promise_end_token_id is not None)
            and self.merge_separator_token_ids is not None
            and (
                self.failed_child_marker is None
                or self.failed_child_marker_token_ids is not None
            )
            and (
                self.child_prompt_template is None
                or self.child_prompt_prefix_token_ids is not None
            )
        )

    def resolve(self, tokenizer: Any, vocab_size: int | None = None) -> "SpecialKwargs":
        """Return a copy with token strings turned into ids and text fields
        tokenized, checked against ``tokenizer`` (and ``vocab_size``, the
        model's, when given)."""
        updates: dict[str, Any] = {}
        for name in ("sync", "promise", "promise_end"):
            tok = getattr(self, f"{name}_token")
            tid = getattr(self, f"{name}_token_id")
            if tok is None:
                continue
            resolved = token_string_to_id(tokenizer, tok, f"{name}_token")
            if tid is not None and tid != resolved:
                raise SpecialKwargsError(
                    f"{name}_token {tok!r} is token id {resolved}, but "
                    f"{name}_token_id is {tid}"
                )
            updates[f"{name}_token_id"] = resolved
        if self.merge_separator_token_ids is None:
            updates["merge_separator_token_ids"] = tuple(
                _encode(tokenizer, self.merge_separator)
            )
        if self.failed_child_marker is not None and self.failed_child_marker_token_ids is None:
            updates["failed_child_marker_token_ids"] = tuple(
                _encode(tokenizer, self.failed_child_marker)
            )
        if self.child_prompt_template is not None and self.child_prompt_prefix_token_ids is None:
            prefix, suffix = self.child_prompt_template.split(PAYLOAD_PLACEHOLDER)
            updates["child_prompt_prefix_token_ids"] = tuple(_encode(tokenizer, prefix))
            updates["child_prompt_suffix_token_ids"] = tuple(_encode(tokenizer, suffix))
        if self.fork_tag is not None:
            check_expressible(tokenizer, self.tag_format.texts)
        resolved_kwargs = dataclasses.replace(self, **updates)
        limit = _vocab_limit(tokenizer, vocab_size)
        if limit is not None:
            resolved_kwargs.check_vocab(limit)
        return resolved_kwargs

    def check_vocab(self, vocab_size: int) -> None:
        """Raise when a hook token id is outside ``[0, vocab_size)``."""
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
            return  # unknown vocabulary size: nothing to check against
        for name in ("sync_token_id", "promise_token_id", "promise_end_token_id"):
            tid = getattr(self, name)
            if tid is not None and tid >= vocab_size:
                raise SpecialKwargsError(
                    f"{name} {tid} is outside the model's vocabulary "
                    f"(size {vocab_size})"
                )

    # ----------------------------------------------------------------- JSON
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SpecialKwargs":
        if isinstance(data, SpecialKwargs):
            return data
        if not isinstance(data, Mapping):
            raise SpecialKwargsError(
                f"special_kwargs must be a SpecialKwargs or a dict, got "
                f"{type(data).__name__}"
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecialKwargsError(
                f"unknown special_kwargs field(s): {', '.join(unknown)}; "
                f"known fields: {', '.join(sorted(known))}"
            )
        return cls(**dict(data))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "SpecialKwargs":
        return cls.from_dict(json.loads(text))

    def to_additional_config(
        self, existing: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Merge into a vLLM ``additional_config`` dict (a new dict)."""
        out = dict(existing or {})
        out[ADDITIONAL_CONFIG_KEY] = self.to_dict()
        return out

    @classmethod
    def from_additional_config(
        cls, additional_config: Mapping[str, Any] | None
    ) -> "SpecialKwargs | None":
        if not additional_config or ADDITIONAL_CONFIG_KEY not in additional_config:
            return None
        return cls.from_dict(additional_config[ADDITIONAL_CONFIG_KEY])

    def with_overrides(self, **overrides: Any) -> "SpecialKwargs":
        return dataclasses.replace(self, **overrides)


def coerce_special_kwargs(value: Any, model: Any = None) -> SpecialKwargs | None:
    """Accept ``None``, a :class:`SpecialKwargs`, a dict (which may name a
    format under ``"format"``), a format name such as ``"promise"``, or
    ``"auto"`` (the settings in ``model``'s directory); see
    :mod:`vllm_seqhooks.presets`."""
    if value is None:
        return None
    if isinstance(value, SpecialKwargs):
        return value
    from vllm_seqhooks.presets import expand

    return SpecialKwargs.from_dict(expand(value, model))


def _encode(tokenizer: Any, text: str) -> list[int]:
    if text == "":
        return []
    return list(tokenizer.encode(text, add_special_tokens=False))


def token_string_to_id(tokenizer: Any, token: str, field_name: str) -> int:
    """The id of ``token`` if it is exactly one token, else a clear error."""
    ids = _encode(tokenizer, token)
    if len(ids) != 1:
        raise SpecialKwargsError(
            f"{field_name} {token!r} is not a single token of this tokenizer "
            f"(it encodes to {len(ids)} tokens: {ids}); add it to the "
            f"tokenizer as a special token or give the id instead"
        )
    return int(ids[0])


def check_expressible(tokenizer: Any, texts: Mapping[str, str]) -> None:
    """Raise when the tokenizer cannot write one of ``texts`` (its tokens
    decode to other text, e.g. through an unknown-token id)."""
    for name, text in texts.items():
        ids = _encode(tokenizer, text)
        back = tokenizer.decode(ids, skip_special_tokens=False)
        if back != text:
            raise SpecialKwargsError(
                f"{name} {text!r} cannot be written with this model's tokenizer "
                f"(it encodes to {ids}, which decode to {back!r})")


def _vocab_limit(tokenizer: Any, vocab_size: int | None) -> int | None:
    sizes: list[int] = []
    if vocab_size is not None:
        sizes.append(int(vocab_size))
    try:
        sizes.append(len(tokenizer))
    except TypeError:
        pass
    return min(sizes) if sizes else None
