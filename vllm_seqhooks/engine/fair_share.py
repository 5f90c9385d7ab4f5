"""Fair share applied: the plan of :mod:`vllm_seqhooks.core.fair_share` keeps
over-share children out of this step's admission (the scheduler skips
them, see ``_handle_blocked_waiting_request``) and preempts the newest
children of a family that holds more than its share while others wait."""

from __future__ import annotations

import logging
import time
from vllm.v1.request import Request, RequestStatus

from vllm_seqhooks.core.fair_share import Entry, plan
from vllm_seqhooks.core.kv_blocks import blocks_to_start

# Under vLLM's "vllm" logger: same handlers, format and VLLM_LOGGING_LEVEL.
logger = logging.getLogger("vllm.seqhooks.scheduler")


class FairShare:
    """Keeps one family from starving the others."""

    def __init__(self, sched) -> None:  # the SeqHooksMixin scheduler
        self.sched = sched

    def hold_over_share(self) -> None:
        """Apply this step's plan: preempt what it says, and keep over-share
        children out of this step's admission."""
        self.sched.fork_join.held_this_step.update(self._holds())

    def _holds(self) -> list[str]:
        sched = self.sched
        fj = sched.fork_join
        children = fj.children
        # Only children are held back or preempted, and only for a request
        # that is not one: without both there is no plan to make.
        parked_status = RequestStatus.WAITING_FOR_STREAMING_REQ
        if all(c.status == parked_status for c in children.values()):
            return []
        queued = [req for req in sched.waiting
                  if req.status != parked_status and req.request_id not in fj.held_this_step]
        if all(req.request_id in children for req in queued):
            return []
        waiting = [self._entry(req) for req in queued]
        # Siblings share their parent's blocks: each block counts once per
        # family (parked parents first, whose context their children share).
        seen: dict[str, set[int]] = {}
        parked = [self._entry(st.request, with_blocks=seen)
                  for st in fj.states.values()
                  if st.parked and st.spilled_frontier is None]
        running = [self._entry(req, with_blocks=seen) for req in sched.running]
        decided = plan(waiting, running, max_running=sched.max_num_running_reqs,
                       total_blocks=sched.kv_cache_manager.block_pool.num_gpu_blocks,
                       parked=parked, forked_after=_ForkedAfter(fj.families))
        if decided.preempt:
            now = time.time()
            for rid in decided.preempt:
                req = sched.requests[rid]
                sched.running.remove(req)
                sched._preempt_request(req, now)
            sched.metrics.inc("fair_share_preemptions", len(decided.preempt))
            logger.debug("fair share (%d slots per family): preempted %s",
                         decided.share, decided.preempt)
        # Preempted children are over their family's share too.
        return decided.hold + decided.preempt

    def _entry(self, req: Request, *, with_blocks: dict[str, set[int]] | None = None
               ) -> Entry:
        """A waiting request (``with_blocks`` None) with the blocks it needs
        to start; a request holding blocks with those of its blocks that
        ``with_blocks`` (the blocks counted so far, by family) lacks."""
        sched = self.sched
        fj = sched.fork_join
        rid = req.request_id
        st = fj.states.get(rid)
        family = st.family.root_id if st is not None and st.family is not None else rid
        is_child = rid in fj.children
        if with_blocks is None:
            # Waiting: what it needs to start, and when it came.
            return Entry(rid, family, req.priority, is_child,
                         blocks_to_start(req.num_tokens, req.num_computed_tokens,
                                         sched.block_size), fj.arrival_order.get(rid))
        block_ids = sched.kv_cache_manager.get_block_ids(rid)[0]
        if st is None or st.family is None:  # a family of one: no block shared
            return Entry(rid, family, req.priority, is_child, len(block_ids))
        seen = with_blocks.setdefault(family, set())
        ids = set(block_ids) - seen
        seen |= ids
        return Entry(rid, family, req.priority, is_child, len(ids))


class _ForkedAfter:
    """``family -> FamilyLedger.forked_after``, read from the ledgers as
    the plan asks (no per-step copy)."""

    def __init__(self, families) -> None:
        self.families = families

    def get(self, family: str, default=None):
        ledger = self.families.get(family)
        return default if ledger is None or ledger.forked_after is None else ledger.forked_after
