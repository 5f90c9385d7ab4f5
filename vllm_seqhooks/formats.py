"""Tag formats: fork/join written as text tags (pure, no vLLM import).

The published parallel-reasoning models (ThreadWeaver, Multiverse, NPR,
Parallel-R1) fork at a text tag and join implicitly: the parent stops at the
tag, one child runs per outline item (or a fixed number of children), each
child starts from the parent's context plus a header and ends at its own end
tag, and the parent resumes once they all ended, with every header and child
output appended, then a suffix. :class:`TagFormat` is that description;
:class:`TagFormatScanner` reads a request's sampled tokens for it and
returns what the scheduler applies:

- ``ForkReached(pos, labels)``: the token at ``pos`` completed the fork tag;
  one child per label (an outline number, or ``"1"`` .. ``"N"``);
- ``EndTagReached(pos)``: a child's end tag was completed at ``pos``;
- ``PromiseIgnored(pos, reason)``: a fork (or some of its children) that
  spawns nothing.

Tags are matched on the bytes the tokens stand for
(:class:`~vllm_seqhooks.tag_scan.TagScanner`), so they are found whatever the
tokenizer split them into. Text the engine adds (headers, the end tag after
EOS, the suffix) is encoded by :class:`TextCodec`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence

from vllm_seqhooks.tag_scan import TagHit, TagScanner
from vllm_seqhooks.tokens import PromiseIgnored

#: Replaced by a child's label in ``child_header``.
LABEL_PLACEHOLDER = "{n}"


class TagFormatError(ValueError):
    """A tag-format setting is invalid. The message names the field."""


@dataclass(frozen=True)
class TagFormat:
    """A fork/join format written in text tags (see the module docstring)."""

    #: The tag at which the parent forks and parks (e.g. ``"</Outlines>"``).
    fork_tag: str
    #: One child per ``<outline_tag> N:`` item written since the last fork...
    outline_tag: str | None = None
    #: ... or this many children at each fork.
    fork_count: int | None = None
    #: Appended to the parent's context to start child ``{n}``, after
    #: ``header_lead``; in the merge, the lead comes once, before the first.
    child_header: str = ""
    header_lead: str = ""
    #: A child stops after writing this tag (kept in its output).
    child_end_tag: str | None = None
    #: Appended to a child's output when it ends otherwise (EOS, length).
    child_eos_text: str | None = None
    #: Appended after the children's outputs when the parent resumes.
    merge_suffix: str = ""
    #: A fork with fewer tokens than this left to sample spawns nothing.
    fork_min_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("fork_tag", "outline_tag", "child_end_tag"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise TagFormatError(f"{name} must be a non-empty string, got {value!r}")
        for name in ("child_header", "header_lead", "merge_suffix"):
            if not isinstance(getattr(self, name), str):
                raise TagFormatError(f"{name} must be a string, got {getattr(self, name)!r}")
        if self.child_eos_text is not None and not isinstance(self.child_eos_text, str):
            raise TagFormatError(f"child_eos_text must be a string, got {self.child_eos_text!r}")
        if (self.outline_tag is None) == (self.fork_count is None):
            raise TagFormatError(
                "a fork_tag format needs exactly one of outline_tag (one child per "
                "outline item) and fork_count (a fixed number of children)")
        for name in ("fork_count", "fork_min_tokens"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise TagFormatError(f"{name} must be an integer >= 1, got {value!r}")
        if self.child_header.count(LABEL_PLACEHOLDER) > 1:
            raise TagFormatError(
                f"child_header may hold {LABEL_PLACEHOLDER} once, got {self.child_header!r}")

    @property
    def texts(self) -> dict[str, str]:
        """The format's text fields that are set, by name."""
        out = {"fork_tag": self.fork_tag}
        for name in ("outline_tag", "child_end_tag", "child_eos_text"):
            if getattr(self, name):
                out[name] = getattr(self, name)
        for name in ("child_header", "header_lead", "merge_suffix"):
            if getattr(self, name):
                out[name] = getattr(self, name).replace(LABEL_PLACEHOLDER, "1")
        return out

    def header(self, label: str) -> str:
        return self.child_header.replace(LABEL_PLACEHOLDER, label)

    def child_start(self, label: str) -> str:
        """What follows the fork tag in child ``label``'s prompt."""
        return self.header_lead + self.header(label)

    @property
    def eos_text(self) -> str:
        if self.child_eos_text is not None:
            return self.child_eos_text
        return self.child_end_tag or ""

    def outline_pattern(self) -> re.Pattern[bytes]:
        assert self.outline_tag is not None
        return re.compile(re.escape(self.outline_tag.encode()) + rb"\s*(\d+)\s*:")


class TextCodec:
    """A tokenizer as the format code needs it: the bytes of each token id
    and ``encode(text) -> ids`` (cached; no special tokens added)."""

    def __init__(self, table: Sequence[bytes] | Callable[[], Sequence[bytes]],
                 encode: Callable[[str], Sequence[int]]) -> None:
        #: The table, or what builds it on first use.
        self._table = table
        self._encode = encode
        self._cache: dict[str, tuple[int, ...]] = {}

    @classmethod
    def from_tokenizer(cls, tokenizer, size: int | None = None) -> "TextCodec":
        """From a Hugging Face tokenizer (``size``: ids to cover, e.g. the
        model's padded vocabulary); the byte table is read on first use."""
        from vllm_seqhooks.token_bytes import token_bytes_table

        return cls(lambda: token_bytes_table(tokenizer, size),
                   lambda text: tokenizer.encode(text, add_special_tokens=False))

    @property
    def table(self) -> Sequence[bytes]:
        if callable(self._table):
            self._table = self._table()
        return self._table

    def encode(self, text: str) -> tuple[int, ...]:
        ids = self._cache.get(text)
        if ids is None:
            ids = tuple(int(t) for t in self._encode(text)) if text else ()
            if len(self._cache) < 4096:
                self._cache[text] = ids
        return ids

    def text(self, ids: Sequence[int]) -> bytes:
        table = self.table
        return b"".join(table[t] for t in ids if 0 <= t < len(table))


@dataclass(frozen=True)
class ForkReached:
    #: The token that completed the fork tag (the children's context ends
    #: with it, and the parent parks there).
    pos: int
    labels: tuple[str, ...]
    #: The token holding the fork tag's first byte.
    tag_start: int = -1

    @property
    def end(self) -> int:
        return self.pos


@dataclass(frozen=True)
class EndTagReached:
    pos: int


class TagFormatScanner:
    """Scans one request's sampled tokens for a :class:`TagFormat`.

    ``may_fork``: forks of this request spawn children (else the fork tag is
    plain text); ``ends_at_tag``: the request is a child that stops at the
    end tag; ``max_children``: children it may spawn in all (None: any)."""

    __slots__ = ("fmt", "tags", "fork_index", "end_index", "since_fork",
                 "children_left", "pattern")

    def __init__(self, fmt: TagFormat, codec: TextCodec, *, may_fork: bool,
                 ends_at_tag: bool, max_children: int | None = None) -> None:
        self.fmt = fmt
        tags: list[bytes] = []
        self.fork_index = self.end_index = -1
        if may_fork:
            self.fork_index = len(tags)
            tags.append(fmt.fork_tag.encode())
        if ends_at_tag and fmt.child_end_tag:
            self.end_index = len(tags)
            tags.append(fmt.child_end_tag.encode())
        if not tags:
            raise ValueError("a TagFormatScanner that neither forks nor ends at a tag")
        self.tags = TagScanner(codec.table, tags)
        self.pattern = fmt.outline_pattern() if may_fork and fmt.outline_tag else None
        #: Bytes sampled since the last fork (where outline items are read).
        self.since_fork: bytes | None = b"" if self.pattern is not None else None
        self.children_left = max_children

    def may_fire(self, tokens: Sequence[int]) -> bool:
        return True

    def copy(self) -> "TagFormatScanner":
        twin = TagFormatScanner.__new__(TagFormatScanner)
        for name in self.__slots__:
            setattr(twin, name, getattr(self, name))
        twin.tags = self.tags.copy()
        return twin

    def feed(self, tokens: Sequence[int], start_pos: int) -> list:
        events: list = []
        hits = self.tags.feed(tokens, start_pos)
        if self.since_fork is None:
            for hit in hits:
                events.extend(self._on_hit(hit, b""))
            return events
        # Outline items are read from the bytes up to each fork.
        done = 0
        for hit in hits:
            upto = hit.pos - start_pos + 1
            self.since_fork += b"".join(self.tags.bytes_of(t) for t in tokens[done:upto])
            done = upto
            events.extend(self._on_hit(hit, self.since_fork))
            if hit.tag == self.fork_index:
                self.since_fork = b""
        self.since_fork += b"".join(self.tags.bytes_of(t) for t in tokens[done:])
        return events

    def finish(self, end_pos: int) -> list:
        return []

    def _on_hit(self, hit: TagHit, text: bytes) -> list:
        pos = hit.pos
        if hit.tag == self.end_index:
            return [EndTagReached(pos)]
        fmt = self.fmt
        if self.pattern is not None:
            labels: list[str] = []
            for match in self.pattern.finditer(text):
                label = match.group(1).decode()
                if label not in labels:
                    labels.append(label)
            if not labels:
                return [PromiseIgnored(pos, "no_outline_items")]
        else:
            labels = [str(i + 1) for i in range(fmt.fork_count or 0)]
        events: list = []
        if self.children_left is not None:
            if self.children_left < len(labels):
                events.append(PromiseIgnored(pos, "max_children_per_request"))
                labels = labels[: self.children_left]
            self.children_left -= len(labels)
        if labels:  # last: the request parks there
            events.append(ForkReached(pos, tuple(labels), hit.first_pos))
        return events


def child_prompt(codec: TextCodec, context: Sequence[int], tag_start: int,
                 start_text: str) -> tuple[list[int], tuple[int, ...]]:
    """A child's prompt: the parent's ``context`` (through the fork tag, whose
    first byte is in token ``tag_start``) and ``start_text``, tokenized from
    the tag on as a fresh request's text would be; and the tokens the merge
    appends to the parent for that start (the same, unless the fresh
    tokenization also re-splits the parent's own tokens, which stay)."""
    appended = codec.encode(start_text)
    tail = tuple(context[tag_start:]) if 0 <= tag_start < len(context) else ()
    try:
        tail_text = codec.text(tail).decode("utf-8")
    except UnicodeDecodeError:
        tail = ()
    if not tail:
        return [*context, *appended], appended
    fresh = codec.encode(tail_text + start_text)
    if fresh[: len(tail)] == tail:
        return [*context, *fresh[len(tail):]], fresh[len(tail):]
    return [*context[:tag_start], *fresh], appended


def merged_layout(starts: Sequence[Sequence[int]], headers: Sequence[Sequence[int]],
                  outputs: Sequence[Sequence[int]], separator: Sequence[int] = (),
                  suffix: Sequence[int] = ()) -> list[int]:
    """What a parent resumes with: the first child's start (lead and header:
    the tokens its prompt ends with) and output, then for each other child
    ``separator``, its header and output, then ``suffix``. ``starts`` and
    ``headers`` hold one entry per child (empty for the promise protocol)."""
    out: list[int] = []
    for i, output in enumerate(outputs):
        if i:
            out.extend(separator)
            out.extend(headers[i])
        else:
            out.extend(starts[0])
        out.extend(output)
    out.extend(suffix)
    return out
