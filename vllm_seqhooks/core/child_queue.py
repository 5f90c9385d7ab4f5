"""Where a new child waits (pure logic, no vLLM import).

Children wait ahead of every request that has not started: a parked
parent's children must be able to run. Among themselves they wait family
by family, oldest family first (a child's arrival time is its family's),
each family's children in the order they were spawned. Siblings share
their parent's context through the prefix cache, so a family whose
children run together holds that context once and for the shortest time;
children spawned one at a time by several families would otherwise
interleave (child 0 of every family, then child 1, ...) and, with a tight
KV cache, run one per family, each holding its own family's context.
"""

from __future__ import annotations

from collections.abc import Iterable


def child_insert_index(waiting: Iterable[tuple[bool, float]], arrival_time: float) -> int:
    """The queue index for a new child with ``arrival_time``. ``waiting``:
    ``(is_child, arrival_time)`` of each waiting request in queue order.
    The child goes after the leading children of its family and of older
    families, before the first request that is not a child."""
    index = 0
    for position, (is_child, arrival) in enumerate(waiting):
        if not is_child:
            break
        if arrival <= arrival_time:
            index = position + 1
    return index
