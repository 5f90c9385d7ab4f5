"""Where a request that took part in splice joins has its positions, and
which of its tokens are isolated paths (pure, no vLLM import).

After a splice join a request holds more tokens than positions: each path
runs from the fork point's position (:mod:`vllm_seqhooks.core.splice_layout`).
A :class:`SpliceMap` says, for every token index, how far its position runs
behind it (``runs``: from each start index on, a shift; 0 before the first),
and which of its tokens are hidden from earlier tokens (``isolated``: index
ranges, the tokens of every path after a fork's first). A request computes a token at ``index + shift_at(index)``
whether it computes it for the first time or again after vLLM preempted it,
and a child spawned after a join inherits its parent's map with its context.

Causal attention recomputes a path exactly only when it is the first of its
fork: a request that computes an ``isolated`` token again (preempted, its
blocks gone from the prefix cache; a child whose context was not all in the
prefix cache) lets a later path see an earlier one. The scheduler counts
such tokens; the positions stay right.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Sequence

#: A step's shifts for one request: (offset of the first token in the step
#: it applies to, shift), offsets ascending from 0.
StepRuns = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class SplicePath:
    """A path of a splice join: laid out from the parent's token ``at``,
    ``length`` tokens, computed by a child whose map is ``child``."""

    at: int
    length: int
    child: "SpliceMap"


@dataclass(frozen=True)
class SpliceMap:
    runs: tuple[tuple[int, int], ...] = ()
    isolated: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        starts = [start for start, _ in self.runs]
        if starts != sorted(set(starts)) or any(s < 0 for s in starts):
            raise ValueError(f"run starts must ascend from 0: {self.runs}")

    def __bool__(self) -> bool:
        return bool(self.runs or self.isolated)

    def shift_at(self, index: int) -> int:
        i = bisect.bisect_right(self.runs, (index, float("inf"))) - 1
        return self.runs[i][1] if i >= 0 else 0

    @property
    def final(self) -> int:
        """The shift of every token after the last join."""
        return self.runs[-1][1] if self.runs else 0

    def step_runs(self, first: int, count: int) -> StepRuns:
        """The shifts of tokens ``first`` .. ``first + count - 1`` (one step's
        tokens of the request), or () when none is shifted."""
        runs = [(0, self.shift_at(first))]
        i = bisect.bisect_right(self.runs, (first, float("inf")))
        for start, shift in self.runs[i:]:
            if start >= first + count:
                break
            runs.append((start - first, shift))
        return tuple(runs) if any(shift for _, shift in runs) else ()

    def isolated_among(self, first: int, count: int) -> int:
        """How many of tokens ``first`` .. ``first + count - 1`` are isolated."""
        last = first + count
        return sum(max(0, min(end, last) - max(start, first)) for start, end in self.isolated)

    def after_join(self, context: int, paths: Sequence[SplicePath]) -> "SpliceMap":
        """The map of a request that splices ``paths`` after its first
        ``context`` tokens (the paths laid out one after another from
        ``context``; each child's tokens from ``context`` on are its path)."""
        if not paths:
            raise ValueError("a splice join needs at least one path")
        base = self.shift_at(context)
        runs = [run for run in self.runs if run[0] < context]
        isolated = [span for span in self.isolated if span[0] < context]
        longest = 0
        at = context
        for k, path in enumerate(paths):
            if path.at != at:
                raise ValueError(f"path {k} is laid out at {path.at}, expected {at}")
            moved = path.at - context  # parent index - child index
            inner = [(start + moved, shift - moved) for start, shift in path.child.runs
                     if context < start < context + path.length]
            runs += [(path.at, path.child.shift_at(context) - moved), *inner]
            if k > 0:
                isolated.append((path.at, path.at + path.length))
            else:
                isolated += [(start + moved, end + moved) for start, end in path.child.isolated
                             if start >= context]
            extent = path.length + path.child.final - base  # positions it spans
            longest = max(longest, extent)
            at += path.length
        runs.append((at, base + longest - (at - context)))
        return SpliceMap(_merged(runs), _joined(isolated))


def _merged(runs: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """``runs`` without those that change nothing (same shift as before)."""
    out: list[tuple[int, int]] = []
    for start, shift in runs:
        if out and out[-1][0] == start:
            out.pop()
        if shift != (out[-1][1] if out else 0):
            out.append((start, shift))
    return tuple(out)


def _joined(spans: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Index ranges, sorted, touching ones made one."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(span for span in spans if span[1] > span[0]):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return tuple(out)
