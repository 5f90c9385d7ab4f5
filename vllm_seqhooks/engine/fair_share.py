"""Fair share applied: each step's share (:mod:`vllm_seqhooks.core.fair_share`)
keeps over-share children out of this step's admission (vLLM's admission
asks it about each waiting child it reaches, see the scheduler's
``_handle_blocked_waiting_request``) and preempts the newest children of a
family that holds more than its share while others wait."""

from __future__ import annotations

import logging
import time
from typing import Iterable
from vllm.v1.request import Request, RequestStatus

from vllm_seqhooks.core.fair_share import Entry, Holdings, StepShare
from vllm_seqhooks.core.waiting_index import WaitingIndex, WaitingKey
from vllm_seqhooks.core.kv_blocks import blocks_to_start
from vllm_seqhooks.engine.lifecycle import PARKED_WITH_BLOCKS
from vllm_seqhooks.engine.metrics import HookMetrics
from vllm_seqhooks.engine.state import ForkJoinState
from vllm_seqhooks.engine.vllm_private import SchedulerPort

# Under vLLM's "vllm" logger: same handlers, format and VLLM_LOGGING_LEVEL.
logger = logging.getLogger("vllm.seqhooks.scheduler")


class FairShare:
    """Keeps one family from starving the others."""

    def __init__(self, fork_join: ForkJoinState, vllm: SchedulerPort,
                 metrics: HookMetrics) -> None:
        self.fork_join = fork_join
        self.vllm = vllm
        self.metrics = metrics
        #: Request id -> ((request, num_tokens, num_computed_tokens), its
        #: entry), for the requests waiting when entries were last read.
        self._known_entries: dict[str, tuple[tuple[Request, int, int], Entry]] = {}
        #: The waiting queue, by family and priority, kept from step to step.
        self._index = WaitingIndex(self._waiting_entries, lambda: self.vllm.waiting)

    def hold_over_share(self) -> None:
        """This step's share: preempt what it says now; children it holds
        back are kept out of admission as vLLM reaches them
        (:meth:`holds_back`)."""
        if not self.vllm.waiting:
            self._index.clear()  # (it keeps no request that left)
            return
        step = self._step()
        self.fork_join.share_step = step
        if step is not None and step.preempt:
            self._preempt(step)

    def holds_back(self, request: Request) -> bool:
        """Whether this step's share (there is one) keeps waiting ``request``
        (a child) out of admission: asked when vLLM's admission reaches it.
        The children it preempted are over their share too."""
        fj = self.fork_join
        rid = request.request_id
        if rid in fj.share_step.preempt:
            return True
        if (rid not in fj.children or request.status == RequestStatus.WAITING_FOR_STREAMING_REQ
                or request.num_computed_tokens):  # (parked, or queued holding blocks)
            return False
        return fj.share_step.holds(self._family(rid), request.priority)

    def _step(self) -> StepShare | None:
        vllm = self.vllm
        fj = self.fork_join
        # Only children are held back or preempted, and only for a request
        # that is not one: without both there is no share to work out.
        parked_status = RequestStatus.WAITING_FOR_STREAMING_REQ
        if all(c.status == parked_status for c in fj.children.values()):
            return None
        waiting = self._index
        waiting.sync(set(vllm.waiting), self._waiting_key)
        if not waiting.has_non_children():
            return None
        step = StepShare(waiting, self._holdings(), max_running=vllm.max_num_running_reqs,
                         total_blocks=vllm.num_blocks,
                         forked_after=_ForkedAfter(fj.families))
        return step if step.active else None

    def _preempt(self, step: StepShare) -> None:
        now = time.time()
        for rid in step.preempt:
            self.vllm.preempt(self.vllm.requests[rid], now)
        self.metrics.inc("fair_share_preemptions", len(step.preempt))
        logger.debug("fair share (%d slots per family): preempted %s",
                     step.share, step.preempt)

    def _family(self, rid: str) -> str:
        st = self.fork_join.states.get(rid)
        return st.family.root_id if st is not None and st.family is not None else rid

    def _waiting_key(self, req: Request) -> WaitingKey | None:
        """What the index keeps of a waiting request (None for a waiting
        streaming session: it does not wait for a slot)."""
        if req.status == RequestStatus.WAITING_FOR_STREAMING_REQ:
            return None
        rid = req.request_id
        if rid in self.fork_join.children:
            return WaitingKey(self._family(rid), req.priority, True, None)
        return WaitingKey(rid, req.priority, False, self.fork_join.arrival_order.get(rid))

    def _waiting_entries(self) -> list[Entry]:
        """The waiting requests' entries in queue order (parked sessions
        left out): what each needs to start, and when it came; read only
        when the step's share needs them one by one. A waiting request's
        entry changes only when its tokens do (it ran, or was preempted):
        entries are kept and built again only then."""
        parked_status = RequestStatus.WAITING_FOR_STREAMING_REQ
        known = self._known_entries
        entries: list[Entry] = []
        for req in self.vllm.waiting:
            if req.status == parked_status:
                continue
            key = (req, req.num_tokens, req.num_computed_tokens)
            kept = known.get(req.request_id)
            if kept is None or kept[0] != key:
                kept = known[req.request_id] = (key, self._waiting_entry(req))
            entries.append(kept[1])
        if len(known) > 2 * len(entries) + 64:  # (forget requests gone)
            self._known_entries = {e.request_id: known[e.request_id] for e in entries}
        return entries

    def _waiting_entry(self, req: Request) -> Entry:
        fj = self.fork_join
        rid = req.request_id
        is_child = rid in fj.children
        # (A request that is not a child is its family's root.)
        family = self._family(rid) if is_child else rid
        return Entry(rid, family, req.priority, is_child,
                     blocks_to_start(req.num_tokens, req.num_computed_tokens,
                                     self.vllm.block_size), fj.arrival_order.get(rid))

    def _holdings(self) -> Holdings:
        """The running requests' slots by family, in one pass that builds no
        entry; a family's blocks and the running entries only when the share
        asks for them (while it is worked out, before vLLM schedules)."""
        vllm = self.vllm
        children = self.fork_join.children
        family_of = self._family
        slots: dict[str, int] = {}
        child_families: set[str] = set()
        for req in vllm.running:
            family = family_of(req.request_id)
            slots[family] = slots.get(family, 0) + 1
            if req.request_id in children:
                child_families.add(family)
        members: dict[str, list[Request]] = {}

        def blocks(family: str) -> int:
            if not members:  # (the first family asked: index them all)
                for req in self._holders():
                    members.setdefault(family_of(req.request_id), []).append(req)
            return self._family_blocks(members.get(family, ()))

        # vLLM admits a waiting request only while its running requests and
        # waiting sessions (parked requests are not counted) leave room.
        active = (len(vllm.running) + vllm.num_waiting_for_streaming_input
                  - self.fork_join.num_parked)
        return Holdings(slots=slots, free_slots=vllm.max_num_running_reqs - len(vllm.running),
                        room=max(0, vllm.max_num_active_reqs - active),
                        child_families=child_families, blocks=blocks,
                        running=self._running_entries)

    def _holders(self) -> list[Request]:
        """Requests holding blocks the plan counts: parked parents (not
        spilled), then the running requests."""
        fj = self.fork_join
        parked = [st.request for st in fj.states.values()
                  if st.phase in PARKED_WITH_BLOCKS]
        return parked + list(self.vllm.running)

    def _family_blocks(self, requests: Iterable[Request]) -> int:
        """Blocks ``requests`` (one family's) hold, each counted once."""
        seen: dict[str, set[int]] = {}
        return sum(self._unseen_blocks(req, seen) for req in requests)

    def _running_entries(self) -> list[Entry]:
        """Every running request's entry, in admission order, with the blocks
        no request before it holds (parked parents first; siblings share
        their parent's blocks: each block counts once per family)."""
        seen: dict[str, set[int]] = {}
        holders = self._holders()
        entries = [self._holding_entry(req, seen) for req in holders]
        return entries[len(holders) - len(self.vllm.running):]

    def _holding_entry(self, req: Request, seen: dict[str, set[int]]) -> Entry:
        rid = req.request_id
        return Entry(rid, self._family(rid), req.priority, rid in self.fork_join.children,
                     self._unseen_blocks(req, seen))

    def _unseen_blocks(self, req: Request, seen: dict[str, set[int]]) -> int:
        """How many of the blocks ``req`` holds ``seen`` (the blocks counted
        so far, by family) lacks, adding them: siblings share their parent's
        blocks, each counted once per family. A request without a family
        ledger is a family of one: all its blocks are its own."""
        rid = req.request_id
        block_ids = self.vllm.block_ids(rid)
        st = self.fork_join.states.get(rid)
        if st is None or st.family is None:
            return len(block_ids)
        counted = seen.setdefault(st.family.root_id, set())
        ids = set(block_ids) - counted
        counted |= ids
        return len(ids)


class _ForkedAfter:
    """``family -> FamilyLedger.forked_after``, read from the ledgers as
    the plan asks (no per-step copy)."""

    def __init__(self, families) -> None:
        self.families = families

    def get(self, family: str, default=None):
        ledger = self.families.get(family)
        return default if ledger is None or ledger.forked_after is None else ledger.forked_after
