"""What a scanner of sampled tokens reports (pure, no vLLM import).

A *scanner* reads one request's sampled tokens, step by step, and returns
events for the scheduler to apply. There are two: the promise protocol's
:class:`~vllm_seqhooks.formats.promise.PromiseScanner` (hook tokens) and the
tag formats' :class:`~vllm_seqhooks.formats.tag_format_scanner.TagFormatScanner`
(text tags). Both follow :class:`HookScanner`; each reports the events below
that its format has. Positions are indexes in the request's whole token
sequence (prompt and output).

Promise protocol:

- ``PayloadClosed(start, end, context_end, closed_by)``: a promise's payload
  spans ``tokens[start:end]`` (``start`` is just after ``<promise>``; ``end``
  is the position of the closing token, or of the end of generation);
  ``context_end`` is where a forked child's prompt ends: after ``</promise>``
  when that token closed the payload, else at ``end``. A child spawns.
- ``SyncReached(pos)``: a ``<sync>`` at ``pos``; the request parks when it
  has open children.

Tag formats:

- ``ForkReached(pos, labels, tag_start)``: the token at ``pos`` completed the
  fork tag (whose first byte is in token ``tag_start``); one child per label,
  and the request parks there.
- ``EndTagReached(pos)``: a child's end tag was completed at ``pos``; the
  child finishes there.

Both:

- ``PromiseIgnored(pos, reason)``: a promise, fork or some of a fork's
  children that spawn nothing (the request may not spawn more).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, Union


@dataclass(frozen=True)
class PayloadClosed:
    start: int
    end: int
    context_end: int
    closed_by: str  # "promise_end" | "promise" | "sync" | "finish"


@dataclass(frozen=True)
class SyncReached:
    pos: int


@dataclass(frozen=True)
class PromiseIgnored:
    """A ``<promise>`` that opened nothing (the request may not spawn)."""

    pos: int
    reason: str



@dataclass(frozen=True)
class ForkReached:
    #: The token that completed the fork tag (the children's context ends
    #: with it, and the parent parks there).
    pos: int
    labels: tuple[str, ...]
    #: The token holding the fork tag's first byte.
    tag_start: int = -1



@dataclass(frozen=True)
class EndTagReached:
    pos: int


Event = Union[PayloadClosed, SyncReached, ForkReached, EndTagReached, PromiseIgnored]


class HookScanner(Protocol):
    """Reads one request's sampled tokens for hook events."""

    def may_fire(self, tokens: Sequence[int]) -> bool:
        """Whether feeding ``tokens`` can yield an event (a cheap test)."""

    #: Tokens a quiet step did not feed must be fed, in order, before the
    #: next ones (else skipping them is a no-op); ``fed_to``: the position
    #: after the last token it was fed (None: none to catch up).
    needs_history: bool
    fed_to: int | None

    def watched_ids(self) -> frozenset[int] | None:
        """The token ids whose feeding can yield an event, in its current
        state (None: any token can): a step whose tokens are all outside it
        yields none; they need not be fed unless :attr:`needs_history`."""

    #: :meth:`finish` would report an event now (a promise's payload is
    #: open): the request's stop needs the scanner even in a quiet step.
    pending_finish: bool

    def copy(self) -> "HookScanner":
        """An independent scanner in the same state (to look ahead)."""

    def feed(self, tokens: Sequence[int], start_pos: int) -> list[Event]:
        """Events of ``tokens``, the first of which sits at ``start_pos``."""

    def finish(self, end_pos: int) -> list[Event]:
        """Events of the request's end (``end_pos``: its token count)."""
