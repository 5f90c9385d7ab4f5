"""`TagFormatScanner`: a tag format's scanner of sampled token ids (pure, no
vLLM import).

Tags are matched on the bytes the tokens stand for
(:class:`~vllm_seqhooks.formats.tag_scan.TagScanner`), so they are found
whatever the tokenizer split them into. Outline items (``<Outline> N:``) are
read from the bytes written since the last fork. It reports the events of
:mod:`vllm_seqhooks.formats.events`.
"""

from __future__ import annotations

from typing import Sequence

from vllm_seqhooks.formats.events import EndTagReached, Event, ForkReached, PromiseIgnored
from vllm_seqhooks.formats.tag_format import TagFormat
from vllm_seqhooks.formats.tag_scan import TagHit, TagScanner
from vllm_seqhooks.formats.text_codec import TextCodec


class TagFormatScanner:
    """Scans one request's sampled tokens for a :class:`TagFormat`.

    ``may_fork``: forks of this request spawn children (else the fork tag is
    plain text); ``ends_at_tag``: the request is a child that stops at the
    end tag; ``max_children``: children it may spawn in all (None: any)."""

    __slots__ = ("fmt", "tags", "fork_index", "end_index", "since_fork",
                 "children_left", "pattern", "fed_to")

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
        #: The position after the last token fed (None: not fed yet, or
        #: its request parked: what it is given at the join is not scanned).
        self.fed_to: int | None = None

    def may_fire(self, tokens: Sequence[int]) -> bool:
        return True

    def watched_ids(self) -> frozenset[int]:
        """The ids that can end a tag: a step without them finds nothing,
        and its tokens are fed before the next step that has one (see
        :attr:`needs_history`)."""
        return self.tags.ending_ids()

    #: Tokens of the steps it skipped (from :attr:`fed_to` on) are fed
    #: before the next ones: a tag under way may span them, and outline
    #: items are read from every byte since the last fork.
    needs_history = True

    #: Its end reports nothing (:meth:`finish`).
    pending_finish = False

    def copy(self) -> "TagFormatScanner":
        twin = TagFormatScanner.__new__(TagFormatScanner)
        for name in self.__slots__:
            setattr(twin, name, getattr(self, name))
        twin.tags = self.tags.copy()
        return twin

    def feed(self, tokens: Sequence[int], start_pos: int) -> list[Event]:
        events: list[Event] = []
        self.fed_to = start_pos + len(tokens)
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

    def finish(self, end_pos: int) -> list[Event]:
        return []

    def _on_hit(self, hit: TagHit, text: bytes) -> list[Event]:
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
        events: list[Event] = []
        if self.children_left is not None:
            if self.children_left < len(labels):
                events.append(PromiseIgnored(pos, "max_children_per_request"))
                labels = labels[: self.children_left]
            self.children_left -= len(labels)
        if labels:  # last: the request parks there
            events.append(ForkReached(pos, tuple(labels), hit.first_pos))
        return events
