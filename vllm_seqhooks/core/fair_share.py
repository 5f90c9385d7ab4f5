"""Fair share between families: which waiting children to hold back, and
which running children to preempt, so that one family cannot starve other
requests.

Pure Python, no vLLM import; the scheduler gives a snapshot of its queues
and applies the plan.

A *family* is a request and its descendants; a request without hooks is a
family of one. Children are queued ahead of requests that have not started
(a parked parent's children must be able to run, or the cache fills with
parked families). Left at that, a family that keeps spawning takes every
running slot. The policy bounds it as max-min fair sharing of the slots
(the "equal share per user" of fair queueing, applied to vLLM's
``max_num_seqs`` slots and to its KV blocks), and only while another family
waits, so that the engine stays work-conserving:

* ``share = max(1, max_running // contenders)`` slots and
  ``total_blocks // contenders`` KV blocks, where contenders are the
  families with a request running or waiting; a family's blocks are those
  its running and parked requests hold, each counted once (siblings share
  their parent's context);
* a waiting child whose family already holds its share of slots is held
  back for this step when a request of another family, of the same or a
  more urgent priority, waits; one whose family holds more than its share of
  blocks, when such a request waits that a share of blocks could hold. A
  request that needs more than a share cannot be given one by holding
  others back: under KV pressure that would only leave blocks idle, and the
  families already started go first (they finish, and free their blocks,
  sooner);
* when such a request waits and no slot is free, the newest running child
  of the family most above its share of slots is preempted (vLLM's
  recompute preemption: its cached blocks stay in the prefix cache), one
  per waiting request, never taking a family below its share, and only
  for a request that arrived after that family forked: preemption is
  there for the request that comes while a family holds the slots. One
  that was already waiting when the family forked (a batch given all at
  once, such as an RL step's GRPO groups) gets the slots its children
  free, as the holds above give them; preempting for it would only trade
  one family's recomputation for another's progress (measured:
  docs/benchmarks/rollout.md). Blocks are not preempted for: under KV
  pressure, preempting running children to start other families only
  trades one recomputation for another.

With at least one slot per family, a parked parent's children always keep
one slot (no deadlock); a request that arrives beside a family holding every
slot gets one at the next step, and then decodes every step, so it finishes
within a step or two of its time on an idle engine (tests count it).
Priorities: a family is only held back or preempted for requests of the same
or a more urgent priority (lower value), so ``--scheduling-policy
priority`` is respected between families.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence


@dataclass(frozen=True)
class Entry:
    """One request of the scheduler's queues."""

    request_id: str
    #: The family's root request id (the request's own id when it is not in
    #: a family).
    family: str
    priority: int = 0
    #: True for a child (only children are held back or preempted).
    is_child: bool = False
    #: KV blocks it holds (running and parked requests, each block counted
    #: once per family) or needs to start (waiting requests).
    blocks: int = 0
    #: A waiting request's place in the order the engine was given its
    #: requests (children excepted); None: unknown (preempts as if late).
    arrival: int | None = None


@dataclass
class FairSharePlan:
    hold: list[str] = field(default_factory=list)
    preempt: list[str] = field(default_factory=list)
    share: int = 0


def plan(
    waiting: Sequence[Entry],
    running: Sequence[Entry],
    *,
    max_running: int,
    total_blocks: int,
    parked: Sequence[Entry] = (),
    forked_after: Mapping[str, int] | None = None,
) -> FairSharePlan:
    """The plan for one step. ``waiting`` in queue order, ``running`` in
    admission order, ``parked``: requests holding blocks without a slot,
    ``forked_after``: by family, how many requests had arrived when it
    spawned its first child (its children are preempted only for later
    arrivals)."""
    families = {e.family for e in waiting} | {e.family for e in running}
    if len(families) < 2:
        return FairSharePlan()
    share = max(1, max_running // len(families))
    block_share = max(1, total_blocks // len(families))
    slots: dict[str, int] = {}
    blocks: dict[str, int] = {}
    for e in running:
        slots[e.family] = slots.get(e.family, 0) + 1
        blocks[e.family] = blocks.get(e.family, 0) + e.blocks
    for e in parked:
        blocks[e.family] = blocks.get(e.family, 0) + e.blocks

    # The most urgent priority waiting from each family: of any request
    # (for slots), and of requests that a share of the blocks can hold.
    urgent: dict[str, int] = {}
    urgent_fitting: dict[str, int] = {}
    for e in waiting:
        urgent[e.family] = min(urgent.get(e.family, e.priority), e.priority)
        if e.blocks <= block_share:
            urgent_fitting[e.family] = min(urgent_fitting.get(e.family, e.priority),
                                           e.priority)

    def others_wait(family: str, priority: int, among: dict[str, int]) -> bool:
        return any(p <= priority for f, p in among.items() if f != family)

    def held(e: Entry) -> bool:
        if slots.get(e.family, 0) >= share and others_wait(e.family, e.priority, urgent):
            return True
        return (blocks.get(e.family, 0) > block_share
                and others_wait(e.family, e.priority, urgent_fitting))

    out = FairSharePlan(share=share)
    admitted: dict[str, int] = {}
    deprived: list[Entry] = []
    for e in waiting:
        if e.is_child and held(e):
            out.hold.append(e.request_id)
            continue
        if slots.get(e.family, 0) + admitted.get(e.family, 0) < share and not e.is_child:
            deprived.append(e)
        admitted[e.family] = admitted.get(e.family, 0) + 1
    _preempt_for(deprived, running, max_running, slots, blocks, share, block_share, out,
                 forked_after or {})
    return out


def _preempt_for(deprived: Sequence[Entry], running: Sequence[Entry], max_running: int,
                 slots: dict[str, int], blocks: dict[str, int], share: int,
                 block_share: int, out: FairSharePlan, forked_after: Mapping[str, int]) -> None:
    """A slot for each ``deprived`` waiting request (one under its family's
    share): the free ones, then preempted over-share children of families
    that forked before it arrived."""
    free_slots = max_running - len(running)
    forks = [forked_after.get(e.family) for e in running if e.is_child]
    forks = [n for n in forks if n is not None] or [0]
    first_fork, last_fork = min(forks), max(forks)
    for e in deprived:
        if free_slots > 0:
            free_slots -= 1
            continue
        if e.arrival is not None and e.arrival < first_fork:
            continue  # (waiting since before any running family forked)
        victim = _victim(running, slots, blocks, share, block_share,
                         e, out.preempt, forked_after)
        if victim is None:
            if e.arrival is None or e.arrival >= last_fork:
                return  # (every family was a candidate: none is over its share)
            continue
        out.preempt.append(victim.request_id)  # (its slot goes to ``e``)
        slots[victim.family] -= 1
        blocks[victim.family] -= victim.blocks


def _victim(running: Sequence[Entry], slots: dict[str, int], blocks: dict[str, int],
            share: int, block_share: int, deprived: Entry,
            taken: list[str], forked_after: Mapping[str, int]) -> Entry | None:
    """The newest running child of the family most above its share of
    slots (then of blocks), among families no more urgent than
    ``deprived`` that forked after it arrived; a family always keeps one
    running request."""
    best: Entry | None = None
    best_excess = (0, 0)
    for e in reversed(running):
        if not e.is_child or e.request_id in taken or e.priority < deprived.priority:
            continue
        forked = forked_after.get(e.family)
        if forked is not None and deprived.arrival is not None and deprived.arrival < forked:
            continue  # (it was waiting before this family forked)
        if slots.get(e.family, 0) <= 1:
            continue
        excess = (slots[e.family] - share, blocks.get(e.family, 0) - block_share)
        if excess[0] > 0 and excess > best_excess:
            best, best_excess = e, excess
    return best
