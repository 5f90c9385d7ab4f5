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
(the top-level request and all its descendants), keeping the families in
the order of their first member and each family's members in their current
order. ``vllm_private.install_family_batch_order`` applies them in the V1
model runner's persistent batch before each step. The V2 model runner has no
persistent batch: it orders each step's requests as the scheduler output
lists them (stably sorted, decodes first), so the scheduler lists them in
:func:`grouped_order`. No vLLM import here.
"""

from __future__ import annotations

from collections.abc import Sequence

from vllm_seqhooks.core.request_tree import CHILD_ID_MARKER


def family_of(request_id: str) -> str:
    """The id of the top-level request a (child) request descends from."""
    return request_id.split(CHILD_ID_MARKER, 1)[0]


def family_groups(request_ids: Sequence[str]) -> dict[str, list[int]]:
    """Indexes of ``request_ids`` by family, families in order of their
    first member, members in their order."""
    groups: dict[str, list[int]] = {}
    for index, rid in enumerate(request_ids):
        groups.setdefault(family_of(rid), []).append(index)
    return groups


def grouped_order(request_ids: Sequence[str]) -> list[str] | None:
    """``request_ids`` with every family contiguous (families in order of
    their first member, members in their order), or None when they already
    are. The fork/join scheduler puts its output's requests in this order:
    the V2 model runner builds its batch from that order (sorted, stably,
    decodes first), so decode batches keep families together."""
    groups = family_groups(request_ids)
    if len(groups) == len(request_ids):
        return None
    order = [index for members in groups.values() for index in members]
    if all(i == j for i, j in enumerate(order)):
        return None
    return [request_ids[i] for i in order]


def grouping_swaps(request_ids: Sequence[str]) -> list[tuple[int, int]]:
    """Swaps ``(i, j)``, applied in order, that make every family contiguous.

    Families keep the order of their first member in ``request_ids``; members
    keep their relative order. Empty when the batch is already grouped (the
    usual case once a family's children have all started), so a step costs
    one pass over the ids.
    """
    groups = family_groups(request_ids)
    if len(groups) == len(request_ids):
        return []
    target = [index for members in groups.values() for index in members]
    # position -> original index now there, and the inverse
    at = list(range(len(request_ids)))
    where = list(range(len(request_ids)))
    swaps: list[tuple[int, int]] = []
    for pos, wanted in enumerate(target):
        src = where[wanted]
        if src == pos:
            continue
        displaced = at[pos]
        swaps.append((pos, src))
        at[pos], at[src] = wanted, displaced
        where[wanted], where[displaced] = pos, src
    return swaps
