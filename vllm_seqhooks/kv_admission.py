"""Memory-aware admission of families: start a new request that may spawn
only when the KV cache can hold what the families already started will
still need.

Pure Python, no vLLM import. A parent parks at ``<sync>`` holding its KV
blocks while its children allocate their own (a fork shares the parent's
full blocks through the prefix cache; it needs blocks for the rest of its
prompt and for what it writes); at the join the merged tokens need blocks
too. vLLM admits a request when its prompt fits now; a burst of parents is
admitted before any child exists, they park holding most of the cache, and
their children then run a few at a time between spills and preemptions.

So the scheduler admits a new family only if, after its prompt, the free
blocks still cover one join round for each family that has not yet made
its children's room: the blocks a join round adds to a family are learned
from the joins seen so far (an exponential average of the children's own
blocks plus the merged tokens' blocks), and guessed as the new request's
prompt blocks until the first join. Requests without hooks and requests
already started (children, preempted or spilled parents) are never held,
and a family is always admitted when no other family is active, so the
engine cannot stall on the rule.
"""

from __future__ import annotations

from dataclasses import dataclass


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-max(0, tokens) // block_size)


@dataclass
class JoinFootprint:
    """What one join round adds to a family's KV blocks, learned."""

    #: Weight of the newest join in the average.
    alpha: float = 0.25
    blocks_per_join: float | None = None
    joins_seen: int = 0

    def observe(self, blocks: int) -> None:
        self.joins_seen += 1
        if self.blocks_per_join is None:
            self.blocks_per_join = float(blocks)
        else:
            self.blocks_per_join += self.alpha * (blocks - self.blocks_per_join)

    def growth(self, prompt_blocks: int) -> float:
        """Blocks a family's next join round is expected to add."""
        if self.blocks_per_join is None:
            return float(prompt_blocks)
        return self.blocks_per_join


def admit_families(
    candidates: list[tuple[str, int]],
    *,
    free_blocks: int,
    growing_families: int,
    footprint: JoinFootprint,
) -> list[str]:
    """Which of ``candidates`` (request id, prompt blocks still to
    allocate), in queue order, may start now. ``growing_families``: active
    families whose next join round has not been allocated yet (a parent
    running, or parked with a child that has not started). A candidate
    admitted counts as growing once joins have been seen (requests here
    spawn); before, only families that spawned do, so that hooks on but
    unused admit as stock vLLM."""
    admitted: list[str] = []
    free = free_blocks
    growing = growing_families
    for rid, prompt_blocks in candidates:
        growth = footprint.growth(prompt_blocks)
        reserve = growth * growing
        if growing > 0 and free - reserve < prompt_blocks:
            break  # queue order: later candidates wait too
        admitted.append(rid)
        free -= prompt_blocks
        if footprint.joins_seen:
            growing += 1
    return admitted
