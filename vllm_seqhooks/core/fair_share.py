"""Fair share between families: which waiting children to hold back, and
which running children to preempt, so that one family cannot starve other
requests.

Pure Python, no vLLM import. The scheduler gives, each step, the waiting
requests as an index kept through the queue's changes
(:class:`~vllm_seqhooks.core.waiting_index.WaitingIndex`: counts by family
and priority; the entries one by one only when asked) and what the running
and parked requests hold (:class:`Holdings`: counts per family, blocks and
running entries only when asked); :class:`StepShare` works out the
preemptions and the holds of the children admission may reach, once per
family, and vLLM's admission asks it per child it reaches. :func:`plan` is
the same policy over whole queues, one entry per request.

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

import heapq
from dataclasses import dataclass, field
from typing import Callable, Collection, Mapping, Sequence

from vllm_seqhooks.core.waiting_index import WaitingIndex


@dataclass(slots=True)
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
class Holdings:
    """What the running and parked requests hold, in the form the plan reads
    it: counts it always needs, and what it needs only sometimes as callables
    (a family's blocks only to hold back a child of a family under its share
    of slots; the running entries only to choose a child to preempt), so
    that a step's plan does not build an entry per running request."""

    #: Running requests by family.
    slots: Mapping[str, int]
    #: Running slots left (``max_running`` minus the running requests).
    free_slots: int
    #: Families with a running child.
    child_families: Collection[str]
    #: KV blocks a family's running and parked requests hold, each counted once.
    blocks: Callable[[str], int]
    #: The running requests' entries in admission order (``blocks``: those of
    #: its blocks no request before it, parked requests first, counted).
    running: Callable[[], Sequence[Entry]]
    #: How many waiting requests vLLM's admission may start this step, at
    #: most (its free admission slots; None: not known).
    room: int | None = None


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
    """The plan for one step, whole. ``waiting`` in queue order, ``running``
    in admission order, ``parked``: requests holding blocks without a slot,
    ``forked_after``: by family, how many requests had arrived when it
    spawned its first child (its children are preempted only for later
    arrivals). The engine uses :class:`StepShare` instead, which decides
    holds per family and is asked per child as vLLM's admission reaches it."""
    step = StepShare(WaitingIndex.of(waiting), holdings_of(running, parked, max_running),
                     max_running=max_running, total_blocks=total_blocks,
                     forked_after=forked_after)
    if not step.active:
        return FairSharePlan()
    hold = [e.request_id for e in waiting if e.is_child and step.holds(e.family, e.priority)]
    return FairSharePlan(hold=hold, preempt=list(step.preempt), share=step.share)


def holdings_of(running: Sequence[Entry], parked: Sequence[Entry],
                max_running: int) -> Holdings:
    """:class:`Holdings` from entries of every running and parked request."""
    slots: dict[str, int] = {}
    blocks: dict[str, int] = {}
    for e in running:
        slots[e.family] = slots.get(e.family, 0) + 1
        blocks[e.family] = blocks.get(e.family, 0) + e.blocks
    for e in parked:
        blocks[e.family] = blocks.get(e.family, 0) + e.blocks
    return Holdings(slots=slots, free_slots=max_running - len(running),
                    child_families={e.family for e in running if e.is_child},
                    blocks=lambda family: blocks.get(family, 0),
                    running=lambda: running)


class _MostUrgent:
    """The most urgent priority waiting per family, kept as the two most
    urgent families: whether a family other than ``f`` waits with priority
    ``<= p`` is then one comparison."""

    def __init__(self, by_family: dict[str, int]) -> None:
        two = heapq.nsmallest(2, by_family.items(), key=lambda fp: fp[1])
        self.first = two[0] if two else None
        self.second = two[1] if len(two) > 1 else None

    def others_wait(self, family: str, priority: int) -> bool:
        other = self.first if self.first is None or self.first[0] != family else self.second
        return other is not None and other[1] <= priority


def _most_urgent(waiting: Sequence[Entry], max_blocks: int | None = None) -> _MostUrgent:
    """:class:`_MostUrgent` of the waiting requests (of those needing at
    most ``max_blocks`` blocks to start, when given)."""
    by_family: dict[str, int] = {}
    for e in waiting:
        if max_blocks is not None and e.blocks > max_blocks:
            continue
        known = by_family.get(e.family)
        if known is None or e.priority < known:
            by_family[e.family] = e.priority
    return _MostUrgent(by_family)


class StepShare:
    """One step's fair share, from the waiting requests (their index) and
    what the running and parked requests hold: the share of slots and
    blocks, the children to preempt now, and whether a waiting child is
    held back (decided once per family and priority, asked per child as
    vLLM's admission reaches it).

    Holds are decided on the holdings before this step's preemptions (a
    preempted child is held back too: the engine keeps it out); a family's
    blocks are counted only when its slots do not already decide; the
    preemptions are worked out in queue order, which needs the waiting
    requests one by one only when one of them may preempt (it arrived after
    a family with running children forked)."""

    def __init__(self, waiting: WaitingIndex, held: Holdings, *, max_running: int,
                 total_blocks: int, forked_after: Mapping[str, int] | None = None) -> None:
        waiting_families = waiting.families
        contenders = len(waiting_families) + sum(
            1 for f in held.slots if f not in waiting_families)
        self.active = contenders >= 2
        self.preempt: list[str] = []
        self.share = 0
        if not self.active:
            return
        self.share = max(1, max_running // contenders)
        self.block_share = max(1, total_blocks // contenders)
        self._slots = held.slots
        self._blocks = _Blocks(held.blocks)
        # Whether another family waits as urgent: of any request (for
        # slots: the index answers), and (asked only if a hold depends on
        # blocks) of the requests that a share of the blocks can hold.
        self._waiting = waiting
        self._urgent_fitting: _MostUrgent | None = None
        # Holds by (family, priority), asked per child as admission reaches it.
        self._memo: dict[tuple[str, int], bool] = {}
        forks = [forked_after.get(f) for f in held.child_families] if forked_after else []
        forks = [n for n in forks if n is not None] or [0]
        first_fork = min(forks)
        if held.child_families and waiting.arrived_since(first_fork):
            self._preempt_for(waiting.in_order(), held, first_fork, max(forks),
                              forked_after or {})
        self._decide_reachable_holds(waiting, held.room)

    def _decide_reachable_holds(self, waiting: WaitingIndex, room: int | None) -> None:
        """Decide now, on what is held before the step (vLLM gives running
        requests the step's blocks before it reaches the waiting ones), the
        holds of every waiting child vLLM's admission may reach: in queue
        order, until as many requests as it may start (``room``, and a
        slot per child preempted for the share) are not held back; every
        waiting child's when ``room`` is not known."""
        if room is None:
            for family, priority in waiting.child_keys():
                self.holds(family, priority)
            return
        room += len(self.preempt)
        for key in waiting.keys_in_order():
            if room <= 0:
                return
            if key.is_child and self.holds(key.family, key.priority):
                continue
            room -= 1

    def holds(self, family: str, priority: int) -> bool:
        """Whether a waiting child of ``family`` at ``priority`` is held back
        this step: its family holds its share of slots (or more than its
        share of blocks) while a request of another family, as urgent or
        more (and that a share of blocks could hold), waits. (Decided
        before vLLM schedules for the children its admission may reach:
        :meth:`_decide_reachable_holds`.)"""
        key = (family, priority)
        known = self._memo.get(key)
        if known is None:
            known = self._memo[key] = (
                (self._slots.get(family, 0) >= self.share
                 and self._waiting.others_wait(family, priority))
                or (self._blocks[family] > self.block_share
                    and self._fitting().others_wait(family, priority)))
        return known

    def _fitting(self) -> _MostUrgent:
        if self._urgent_fitting is None:
            self._urgent_fitting = _most_urgent(self._waiting.in_order(), self.block_share)
        return self._urgent_fitting

    def _preempt_for(self, waiting: Sequence[Entry], held: Holdings, first_fork: int,
                     last_fork: int, forked_after: Mapping[str, int]) -> None:
        """A slot for each deprived waiting request (a request that is not a
        child, whose family is under its share counting the requests ahead
        of it that are admitted): the free ones, then preempted over-share
        children of families that forked before it arrived."""
        share = self.share
        admitted: dict[str, int] = {}
        free_slots = held.free_slots
        slots = dict(self._slots)
        taken_blocks: dict[str, int] = {}
        running: Sequence[Entry] | None = None
        for e in waiting:
            if e.is_child:
                if not self.holds(e.family, e.priority):
                    admitted[e.family] = admitted.get(e.family, 0) + 1
                continue
            under_share = self._slots.get(e.family, 0) + admitted.get(e.family, 0) < share
            admitted[e.family] = admitted.get(e.family, 0) + 1
            if not under_share:
                continue
            if free_slots > 0:
                free_slots -= 1
                continue
            if e.arrival is not None and e.arrival < first_fork:
                continue  # (waiting since before any running family forked)
            if running is None:
                running = held.running()
            victim = self._victim(running, slots, taken_blocks, e, forked_after)
            if victim is None:
                if e.arrival is None or e.arrival >= last_fork:
                    return  # (every family was a candidate: none is over its share)
                continue
            self.preempt.append(victim.request_id)  # (its slot goes to ``e``)
            slots[victim.family] -= 1
            taken_blocks[victim.family] = taken_blocks.get(victim.family, 0) + victim.blocks

    def _victim(self, running: Sequence[Entry], slots: dict[str, int],
                taken_blocks: dict[str, int], deprived: Entry,
                forked_after: Mapping[str, int]) -> Entry | None:
        """The newest running child of the family most above its share of
        slots (then of blocks), among families no more urgent than
        ``deprived`` that forked after it arrived; a family always keeps one
        running request."""
        best: Entry | None = None
        best_excess = (0, 0)
        for e in reversed(running):
            if (not e.is_child or e.request_id in self.preempt
                    or e.priority < deprived.priority):
                continue
            forked = forked_after.get(e.family)
            if forked is not None and deprived.arrival is not None and deprived.arrival < forked:
                continue  # (it was waiting before this family forked)
            if slots.get(e.family, 0) <= 1:
                continue
            blocks = self._blocks[e.family] - taken_blocks.get(e.family, 0)
            excess = (slots[e.family] - self.share, blocks - self.block_share)
            if excess[0] > 0 and excess > best_excess:
                best, best_excess = e, excess
        return best


class _Blocks(dict):
    """A family's blocks, asked of :attr:`Holdings.blocks` once per family
    per step."""

    def __init__(self, ask: Callable[[str], int]) -> None:
        super().__init__()
        self.ask = ask

    def __missing__(self, family: str) -> int:
        n = self[family] = self.ask(family)
        return n
