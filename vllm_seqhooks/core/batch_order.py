"""Keep each fork/join family together in the model's batch (pure logic).

A request's children start one by one, at their own ``</promise>``. When many
requests fork at once their first children arrive in the same step, then
their second children, and so on, so vLLM's persistent batch (new requests
fill free slots in arrival order) interleaves the families: child 0 of every
family, then child 1 of every family, ... Siblings read the same KV blocks
(their parent's context, shared through the prefix cache), and an attention
kernel that walks the batch in order reuses those blocks from the CPU caches
only when siblings are neighbours. Measured on the CPU backend (one decode
step of 16 families x 4 children with 1,024-token contexts, the same
attention call replayed with its rows reordered): interleaved 10.0 ms per
layer, families grouped 5.0 ms (``python -m benchmarks.attention_order``;
docs/benchmarks/attention_order.md and README.md).

:class:`FamilyGrouping` computes the permutation that groups a batch by
family (the top-level request and all its descendants), leaving each
family's block where most of it already is and moving only members outside
their family's block, with :func:`group_in_python` each step. (Compiled
kernels for this and for the row moves were tried and removed: in Python
the grouping takes 2-4.5 % of the scheduler's time a step at 16-128
families, and the end-to-end time of the engine-step workload did not move
beyond its A/A noise with the kernels;
docs/benchmarks/step_engine.md.)
``vllm_private.install_family_batch_order`` applies it to the V1 model
runner's persistent batch before each step in which a request entered it or
was moved, in one pass over the batch's arrays (``vllm_private.input_batch``)
rather than with vLLM's ``swap_states``, one pair of rows at a time (~13 µs
a pair on a 2-core CPU; a batch in which each of many families grew by one
needs about one pair per row after the first family that grew). The V2
model runner has no persistent
batch: it orders each step's requests as the scheduler output lists them
(stably sorted, decodes first), so the scheduler keeps its running requests
in arrival order (a child arrives at its parent's time), moving only those
that joined in the step (:func:`keep_families_together`). No vLLM import
here.
"""

from __future__ import annotations

from bisect import insort
from collections import Counter
from collections.abc import Iterable
from itertools import compress
from operator import attrgetter, is_not, ne

from vllm_seqhooks.core.request_tree import CHILD_ID_MARKER


def family_of(request_id: str) -> str:
    """The id of the top-level request a (child) request descends from."""
    return request_id.split(CHILD_ID_MARKER, 1)[0]


#: A batch permutation: position ``dst[k]`` takes the request at ``src[k]``
#: (positions not listed keep theirs).
Moves = tuple[list[int], list[int]]


class FamilyGrouping:
    """The moves that make every family contiguous in one batch, step after
    step. It reads, of each step's batch, only the positions whose request
    changed since it last saw it (found by identity, without reading the
    ids), and keeps each request's family as a small integer."""

    def __init__(self, forget_after: int = 8192) -> None:
        self._code_of_request: dict[str, int] = {}
        self._code_of_family: dict[str, int] = {}
        self._forget_after = forget_after
        self._ids: list[str] = []
        self._codes: list[int] = []

    def moves(self, request_ids: list[str]) -> Moves | None:
        """The moves that group ``request_ids`` by family, or None when
        every family is one run already (:func:`group_in_python`)."""
        known = self._code_of_request
        if len(known) > self._forget_after:  # finished requests accumulate
            known.clear()
            self._code_of_family.clear()
            self._ids, self._codes = [], []
        self._ids, self._codes, moves = group_in_python(
            request_ids, self._ids, self._codes, known, self._code_of_family)
        return moves

    def codes(self, request_ids: list[str]) -> list[int]:
        """Each request's family as an integer (the same for one family)."""
        return read_codes_in_python(request_ids, self._ids, self._codes, self._code_of_request,
                                    self._code_of_family)[0]


def group_in_python(ids: list[str], seen: list[str], seen_codes: list[int],
                    known: dict[str, int],
                    families: dict[str, int]) -> tuple[list[str], list[int], Moves | None]:
    """One step of :class:`FamilyGrouping`: the codes of ``ids``
    (:func:`read_codes_in_python`) and, unless every request that changed
    took the place of one of its own family (the last batch was grouped, so
    this one is), the moves that group them (:func:`grouping_moves_in_python`).
    Returns a copy of ``ids`` and the codes, both after the moves, and the
    moves (None when none)."""
    codes, kept = read_codes_in_python(ids, seen, seen_codes, known, families)
    moves = None if kept else grouping_moves_in_python(codes)
    ids = list(ids)
    if moves is not None:
        dst, src = moves
        for values in (ids, codes):
            taken = [values[i] for i in src]
            for i, value in zip(dst, taken):
                values[i] = value
    return ids, codes, moves


def read_codes_in_python(ids: list[str], seen: list[str], seen_codes: list[int],
                         known: dict[str, int],
                         families: dict[str, int]) -> tuple[list[int], bool]:
    """The family code of each request of ``ids``, given the last batch
    (``seen``, with ``seen_codes``): read only where ``ids`` holds another
    object than ``seen`` (compared by identity: the ids are not read) or
    past its end, from ``known`` (request id -> code) or, for a request new
    to it, from ``families`` (family id -> code; a new family takes the next
    code). Also whether each such position holds a member of the family it
    held (then a grouped batch stays grouped)."""
    n = len(ids)
    codes = seen_codes[:n]
    codes += [-1] * (n - len(codes))  # past the last batch's end: changed
    kept = True
    changed = list(compress(range(n), map(is_not, ids, seen)))
    changed += range(min(n, len(seen)), n)
    for pos in changed:
        rid = ids[pos]
        code = known.get(rid)
        if code is None:
            code = known[rid] = families.setdefault(family_of(rid), len(families))
        if code != codes[pos]:
            codes[pos] = code
            kept = False
    return codes, kept


def grouping_moves_in_python(codes: list[int]) -> Moves | None:
    """The moves that make every family (equal codes) contiguous, or None
    when every family is one run already.

    Each family gets a block where its longest run of members already is
    (its first such run; blocks in the order of those runs), a member inside
    its family's block stays, and the members outside it fill the block's
    other slots in order. So a request that enters the batch, or that the
    runner moves into the hole a finished one left, moves with one request
    per block between where it landed and its family."""
    n = len(codes)
    if n < 3:
        return None
    starts = [0]
    starts += compress(range(1, n), map(ne, codes[1:], codes))
    sizes = Counter(codes)
    if len(starts) == len(sizes):
        return None
    best: dict[int, tuple[int, int]] = {}  # family -> (-length, start)
    for start, end in zip(starts, [*starts[1:], n]):
        family = codes[start]
        run = (start - end, start)
        if run < best.get(family, (1, 0)):
            best[family] = run
    owner: list[int] = []
    for family in sorted(best, key=lambda f: best[f][1]):
        owner += [family] * sizes[family]
    misplaced = list(compress(range(n), map(ne, codes, owner)))
    return (sorted(misplaced, key=owner.__getitem__),
            sorted(misplaced, key=codes.__getitem__))


def moves_as_swaps(moves: Moves) -> list[tuple[int, int]]:
    """The same permutation as pairwise swaps ``(i, j)``, applied in order:
    one fewer than the requests moved in each cycle."""
    dst, src = moves
    takes_from = dict(zip(dst, src))
    swaps: list[tuple[int, int]] = []
    for start in dst:
        pos = takes_from.pop(start, None)
        if pos is None or pos == start:
            continue
        swaps.append((start, pos))
        while (nxt := takes_from.pop(pos)) != start:
            swaps.append((pos, nxt))
            pos = nxt
    return swaps


def keep_families_together(running: list, joined: Iterable[str], in_order: bool) -> None:
    """Keep ``running`` (requests with ``request_id`` and ``arrival_time``)
    in arrival order, so that each family (a child arrives at its parent's
    time) is contiguous in it: the V2 model runner batches the requests in
    the scheduler output's order, which lists running requests in this
    order (decodes first, stably). ``in_order``: ``running`` was in arrival
    order after the last step (vLLM only appends to it and removes from
    it); then only the requests that ``joined`` it this step (vLLM appended
    them) move, each to its family's place, and a step with none costs
    nothing. Otherwise it is sorted (stable)."""
    joined = list(joined)
    if not in_order or len(joined) > len(running):
        running.sort(key=_ARRIVAL)
        return
    if not joined:
        return
    tail = running[-len(joined):]
    if {r.request_id for r in tail} != set(joined):
        running.sort(key=_ARRIVAL)
        return
    del running[-len(joined):]
    for request in tail:
        insort(running, request, key=_ARRIVAL)


_ARRIVAL = attrgetter("arrival_time")
