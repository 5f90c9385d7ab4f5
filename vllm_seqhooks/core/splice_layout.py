"""What a KV-splice join computes: positions and attention of a merged
sequence (pure logic, no vLLM import).

A splice join does not re-read the children's outputs: the parent adopts
the KV its children computed, side by side after the fork point. So each
path is computed as its child computed it: it starts at the position right
after the fork point and sees the shared context and itself, never its
siblings. What comes after the paths (the format's suffix, then the
parent's continuation) sees all of them and continues at the fork point's
position plus the longest path's extent. This is how Multiverse and NPR
models are trained (path-isolated attention, shared positions) and how
their engines join.

A :data:`Layout` describes a merged sequence in the order its tokens are
laid out (the parent's context, path 1, path 2, ..., then what follows):
an ``int`` is that many tokens computed one after another, a
:class:`Parallel` is a fork's paths, each a Layout of its own (a path may
fork again). :func:`positions` and :func:`attention_mask` say what each
token's position is and which tokens it attends to; :func:`extent` is how
many positions a layout spans, so a request that continues after a splice
join continues at ``extent`` while holding ``token_count`` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union


@dataclass(frozen=True)
class Parallel:
    """A fork's paths, side by side in the layout, each from the same position."""

    paths: tuple["Layout", ...]

    def __post_init__(self) -> None:
        if not self.paths:
            raise ValueError("a Parallel needs at least one path")


Layout = tuple[Union[int, Parallel], ...]


def token_count(layout: Layout) -> int:
    """How many tokens (KV entries) the layout holds."""
    return sum(piece if isinstance(piece, int) else sum(token_count(p) for p in piece.paths)
               for piece in layout)


def extent(layout: Layout) -> int:
    """How many positions the layout spans: its runs, plus each fork's
    longest path."""
    return sum(piece if isinstance(piece, int) else max(extent(p) for p in piece.paths)
               for piece in layout)


def positions(layout: Layout, start: int = 0) -> list[int]:
    """Each token's position, in layout order."""
    out: list[int] = []
    for piece in layout:
        if isinstance(piece, int):
            out.extend(range(start, start + piece))
            start += piece
        else:
            for path in piece.paths:
                out.extend(positions(path, start))
            start += max(extent(p) for p in piece.paths)
    return out


def path_keys(layout: Layout) -> list[tuple[tuple[int, int], ...]]:
    """For each token, the (fork, path) pairs of the forks it lies inside:
    token ``i`` attends to an earlier token ``j`` unless they lie in
    different paths of the same fork (:func:`attends`)."""
    keys: list[tuple[tuple[int, int], ...]] = []
    forks = 0

    def walk(pieces: Layout, key: tuple[tuple[int, int], ...]) -> None:
        nonlocal forks
        for piece in pieces:
            if isinstance(piece, int):
                keys.extend([key] * piece)
            else:
                fork = forks
                forks += 1
                for index, path in enumerate(piece.paths):
                    walk(path, key + ((fork, index),))

    walk(layout, ())
    return keys


def attends(query: tuple[tuple[int, int], ...], key: tuple[tuple[int, int], ...]) -> bool:
    """Whether a token with path key ``query`` sees an earlier one with ``key``."""
    paths = dict(query)
    return all(paths.get(fork, index) == index for fork, index in key)


def attention_mask(layout: Layout) -> list[list[bool]]:
    """``mask[i][j]``: token ``i`` attends to token ``j`` (causal, and never
    across sibling paths)."""
    keys = path_keys(layout)
    return [[j <= i and attends(keys[i], keys[j]) for j in range(len(keys))]
            for i in range(len(keys))]
