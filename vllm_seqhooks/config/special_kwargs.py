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
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from vllm_seqhooks.config import field_checks as check
from vllm_seqhooks.config.field_checks import SpecialKwargsError, unknown_fields_message
from vllm_seqhooks.formats.tag_format import placeholder_problem

#: Key under which the configuration travels in vLLM's ``additional_config``.
ADDITIONAL_CONFIG_KEY = "seqhooks"

CHILD_CONTEXTS = ("fork", "payload")
MERGE_STRATEGIES = ("concatenate", "none")
BATCH_ORDERS = ("family", "arrival")
JOIN_MODES = ("reprefill", "splice")
#: Said by a refused splice setting: the other join takes any format.
_REPREFILL_HINT = "; or set join='reprefill' (multiverse and npr default to splice)"
PAYLOAD_PLACEHOLDER = "{payload}"
HOOK_TOKENS = ("sync", "promise", "promise_end")

#: The check of each field's own value (cross-field rules are in
#: ``SpecialKwargs._check_combinations``). Tag-format fields are checked by
#: :class:`~vllm_seqhooks.formats.tag_format.TagFormat`.
FIELD_CHECKS: dict[str, check.Check] = {
    **{f"{hook}_token_id": check.token_id for hook in HOOK_TOKENS},
    **{f"{hook}_token": check.text(optional=True, non_empty=True) for hook in HOOK_TOKENS},
    "child_context": check.choice(CHILD_CONTEXTS),
    "child_prompt_template": check.text(optional=True),
    "merge_strategy": check.choice(MERGE_STRATEGIES),
    "batch_order": check.choice(BATCH_ORDERS),
    "join": check.choice(JOIN_MODES),
    "merge_separator": check.text(),
    "failed_child_marker": check.text(optional=True),
    "max_child_depth": check.integer(0),
    "max_children_per_request": check.integer(0),
    "child_max_tokens": check.integer(1, optional=True),
    "family_token_factor": check.integer(1, optional=True),
    "max_descendants": check.integer(0),
    "max_live_children_per_family": check.integer(1),
    "max_live_children": check.integer(1),
    "child_timeout_s": check.seconds(),
    "family_timeout_s": check.seconds(),
    "fair_share": check.flag,
    "merge_separator_token_ids": check.token_ids,
    "failed_child_marker_token_ids": check.token_ids,
    "child_prompt_prefix_token_ids": check.token_ids,
    "child_prompt_suffix_token_ids": check.token_ids,
}


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
    # Limits of a request's family (vllm_seqhooks.core.family_limits) and fair share.
    family_token_factor: int | None = None
    max_descendants: int = 256
    max_live_children_per_family: int = 64
    max_live_children: int = 1024
    child_timeout_s: float | None = None
    family_timeout_s: float | None = None
    fair_share: bool = True
    # A format written in text tags (vllm_seqhooks.formats.tag_format.TagFormat): set
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
    boundary_tokenization: str = "text"
    unclosed_child_stop_text: str | None = None
    #: How a tag format's parent joins: "reprefill" (it prefills the merged
    #: text as one causal sequence) or "splice" (it takes its children's KV,
    #: paths side by side at shared positions; docs/formats/splice.md).
    join: str = "reprefill"
    # Filled in by resolve(); part of the JSON form so that the engine does not
    # need to tokenize again.
    merge_separator_token_ids: tuple[int, ...] | None = field(default=None)
    failed_child_marker_token_ids: tuple[int, ...] | None = field(default=None)
    child_prompt_prefix_token_ids: tuple[int, ...] | None = field(default=None)
    child_prompt_suffix_token_ids: tuple[int, ...] | None = field(default=None)

    def __new__(cls, *args: Any, **kwargs: Any) -> "SpecialKwargs":
        # (before the generated __init__, whose TypeError would not say what is known)
        known = [f.name for f in fields(cls)]
        unknown = set(kwargs).difference(known)
        if unknown:
            raise UnknownFieldError(unknown_fields_message(unknown, known))
        return super().__new__(cls)

    def __post_init__(self) -> None:
        for name, check_value in FIELD_CHECKS.items():
            value = getattr(self, name)
            checked = check_value(name, value)
            if checked is not value:
                object.__setattr__(self, name, checked)
        self._check_combinations()

    def _check_combinations(self) -> None:
        if self.fork_tag is not None:
            self._check_tag_format()
        elif self.join != "reprefill":
            raise SpecialKwargsError(
                f"join={self.join!r} needs a tag format (fork_tag): the promise protocol "
                "joins by re-prefill")
        else:
            for name in ("sync", "promise"):
                if getattr(self, f"{name}_token_id") is None and getattr(
                        self, f"{name}_token") is None:
                    raise SpecialKwargsError(
                        f"{name}_token_id is required (or give {name}_token as a "
                        f"token string, or a fork_tag for a tag format)")
        seen: dict[int, str] = {}
        for hook in HOOK_TOKENS:
            tid = getattr(self, f"{hook}_token_id")
            if tid is None:
                continue
            if tid in seen:
                raise SpecialKwargsError(
                    f"{hook}_token_id and {seen[tid]} must differ, both are {tid}")
            seen[tid] = f"{hook}_token_id"
        template = self.child_prompt_template
        if template is not None:
            if self.child_context != "payload":
                raise SpecialKwargsError(
                    "child_prompt_template is only used with child_context='payload', "
                    f"got child_context={self.child_context!r}")
            problem = placeholder_problem("child_prompt_template", template,
                                          PAYLOAD_PLACEHOLDER, "the payload")
            if problem:
                raise SpecialKwargsError(problem)
            if template.count(PAYLOAD_PLACEHOLDER) != 1:
                raise SpecialKwargsError(
                    f"child_prompt_template must contain {PAYLOAD_PLACEHOLDER} "
                    f"exactly once, got {template!r}")

    def _check_tag_format(self) -> None:
        for name in HOOK_TOKENS:
            if getattr(self, f"{name}_token") is not None or getattr(
                    self, f"{name}_token_id") is not None:
                raise SpecialKwargsError(
                    f"fork_tag (a tag format, joined when the children end) and "
                    f"{name}_token cannot be combined; use one or the other")
        from vllm_seqhooks.formats.tag_format import TagFormatError

        try:
            self.tag_format
        except TagFormatError as exc:
            raise SpecialKwargsError(str(exc)) from None
        if self.join == "splice":
            self._check_splice()

    def _check_splice(self) -> None:
        """A splice join takes each path's KV as its child computed it: the
        engine may not add text inside a path, and a child's prompt must be
        its parent's tokens as they are."""
        fmt = self.tag_format
        if fmt.eos_text:
            raise SpecialKwargsError(
                f"join='splice' needs child_eos_text='' (got {fmt.eos_text!r}): text the "
                "engine adds to a path that ended without its end tag would have to be "
                f"computed inside the path{_REPREFILL_HINT}")
        if fmt.boundary_tokenization != "ids":
            raise SpecialKwargsError(
                "join='splice' needs boundary_tokenization='ids': a child's prompt must "
                f"start with its parent's tokens as they are{_REPREFILL_HINT}")
        if fmt.unclosed_child_stop_text is not None:
            raise SpecialKwargsError(
                f"join='splice' cannot end a parent with unclosed_child_stop_text{_REPREFILL_HINT}")

    @functools.cached_property
    def tag_format(self):
        """The :class:`~vllm_seqhooks.formats.tag_format.TagFormat` made of this
        object's fields of the same names (None: the promise / sync
        protocol); built once."""
        if self.fork_tag is None:
            return None
        from vllm_seqhooks.formats.tag_format import TagFormat

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
        for name in HOOK_TOKENS:
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


class UnknownFieldError(SpecialKwargsError, TypeError):
    """A field ``SpecialKwargs`` does not have (a ``TypeError`` too, as an
    unknown keyword argument is)."""


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
