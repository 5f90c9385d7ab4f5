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

:func:`grouping_swaps` computes the swaps that group a batch by family
(the top-level request and all its descendants), leaving each family's
block where most of it already is and moving only members outside their
family's block. ``vllm_private.install_family_batch_order`` applies them in the V1
model runner's persistent batch before each step in which a request entered
it or was moved. The V2 model runner has no persistent batch: it orders each
step's requests as the scheduler output lists them (stably sorted, decodes
first), so the scheduler keeps its running requests in arrival order (a
child arrives at its parent's time), moving only those that joined in the
step (:func:`keep_families_together`). No vLLM import here.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Iterable, Sequence
from operator import attrgetter

from vllm_seqhooks.core.request_tree import CHILD_ID_MARKER


def family_of(request_id: str) -> str:
    """The id of the top-level request a (child) request descends from."""
    return request_id.split(CHILD_ID_MARKER, 1)[0]


def grouping_swaps(request_ids: Sequence[str]) -> list[tuple[int, int]]:
    """Swaps ``(i, j)``, applied in order, that make every family contiguous.

    Each family gets a block where its longest run of members already is
    (blocks in the order of those runs), a member already inside its
    family's block stays there, and each swap puts at least one member into
    its block (members of a family may change places among themselves). So
    a request that enters the batch, or that the runner moves into the hole
    a finished one left, costs about one swap per block between where it
    landed and its family. Empty when the batch is already grouped.
    """
    families = [family_of(rid) for rid in request_ids]
    order = _block_order(families)
    if order is None:
        return []
    owner = [family for family, size in order for _ in range(size)]
    misplaced = [pos for pos, family in enumerate(families) if family != owner[pos]]
    # For each family, the slots of its block that another family's member holds.
    free: dict[str, list[int]] = {}
    for pos in misplaced:
        free.setdefault(owner[pos], []).append(pos)
    swaps: list[tuple[int, int]] = []
    for pos in misplaced:
        while families[pos] != owner[pos]:
            slots = free[families[pos]]
            dest = slots.pop()
            while families[dest] == owner[dest]:  # filled since it was listed
                dest = slots.pop()
            swaps.append((pos, dest))
            families[pos], families[dest] = families[dest], families[pos]
    return swaps


def _block_order(families: Sequence[str]) -> list[tuple[str, int]] | None:
    """(family, size) in the order of each family's longest run of adjacent
    members (its first such run), or None when every family is one run."""
    sizes: dict[str, int] = {}
    longest: dict[str, tuple[int, int]] = {}  # family -> (-length, start)
    runs = 0
    start = 0
    for pos, family in enumerate(families):
        sizes[family] = sizes.get(family, 0) + 1
        if pos + 1 == len(families) or families[pos + 1] != family:
            runs += 1
            run = (start - pos - 1, start)
            if run < longest.get(family, (1, 0)):
                longest[family] = run
            start = pos + 1
    if runs == len(sizes):
        return None
    return [(family, sizes[family])
            for family in sorted(sizes, key=lambda family: longest[family][1])]


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
