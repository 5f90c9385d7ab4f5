"""`PromiseScanner`: the promise protocol's scanner of sampled token ids
(pure, no vLLM import).

``<promise>`` opens a payload, ``</promise>`` (when configured) closes it,
``<sync>`` closes it too and asks to park; it reports the events of
:mod:`vllm_seqhooks.formats.events`. The fast path (no payload open, no hook
token among the new tokens) is one set lookup per token; the engine does
not feed it steps without a hook token at all (:meth:`watched_ids`).
"""

from __future__ import annotations

from typing import Sequence

from vllm_seqhooks.formats.events import Event, PayloadClosed, PromiseIgnored, SyncReached


class PromiseScanner:
    """Scans one request's sampled tokens for hook events."""

    __slots__ = (
        "sync_id",
        "promise_id",
        "promise_end_id",
        "hook_ids",
        "payload_start",
        "promises_left",
    )

    def __init__(
        self,
        sync_token_id: int,
        promise_token_id: int,
        promise_end_token_id: int | None = None,
        *,
        max_promises: int | None = None,
    ) -> None:
        self.sync_id = sync_token_id
        self.promise_id = promise_token_id
        self.promise_end_id = promise_end_token_id
        self.hook_ids = frozenset(
            t for t in (sync_token_id, promise_token_id, promise_end_token_id)
            if t is not None
        )
        #: Position of the first payload token of the open promise, or None.
        self.payload_start: int | None = None
        #: How many more promises may open (None: unlimited).
        self.promises_left = max_promises

    @property
    def payload_open(self) -> bool:
        return self.payload_start is not None

    def may_fire(self, tokens: Sequence[int]) -> bool:
        """Whether feeding ``tokens`` can yield an event (a cheap test)."""
        return self.payload_start is not None or not self.hook_ids.isdisjoint(tokens)

    def watched_ids(self) -> frozenset[int] | None:
        """The hook token ids: a payload's other tokens yield no event (its
        end, or the request's, closes it: see :attr:`pending_finish`)."""
        return self.hook_ids

    @property
    def pending_finish(self) -> bool:
        """A payload is open: the request's end closes it (:meth:`finish`)."""
        return self.payload_start is not None

    #: Tokens it was not fed (quiet steps) carry nothing it needs.
    needs_history = False
    fed_to = None

    def copy(self) -> "PromiseScanner":
        """An independent scanner in the same state (to look ahead)."""
        twin = PromiseScanner.__new__(PromiseScanner)
        for name in self.__slots__:
            setattr(twin, name, getattr(self, name))
        return twin

    def feed(self, tokens: Sequence[int], start_pos: int) -> list[Event]:
        """Scan ``tokens``, the first of which sits at ``start_pos``."""
        if not self.may_fire(tokens):
            return []
        hook_ids = self.hook_ids
        events: list[Event] = []
        for offset, tok in enumerate(tokens):
            if tok not in hook_ids:
                continue
            pos = start_pos + offset
            if tok == self.promise_id:
                self._close(pos, pos, "promise", events)
                if self.promises_left is not None and self.promises_left <= 0:
                    events.append(PromiseIgnored(pos, "max_children_per_request"))
                    continue
                if self.promises_left is not None:
                    self.promises_left -= 1
                self.payload_start = pos + 1
            elif tok == self.promise_end_id:
                self._close(pos, pos + 1, "promise_end", events)
            else:  # sync
                self._close(pos, pos, "sync", events)
                events.append(SyncReached(pos))
        return events

    def finish(self, end_pos: int) -> list[Event]:
        """The request stopped generating; ``end_pos`` is its token count."""
        events: list[Event] = []
        self._close(end_pos, end_pos, "finish", events)
        return events

    def _close(self, end: int, context_end: int, how: str, events: list[Event]) -> None:
        if self.payload_start is None:
            return
        events.append(PayloadClosed(self.payload_start, end, context_end, how))
        self.payload_start = None
