"""Fair share applied: the plan of :mod:`vllm_seqhooks.fair_share` holds
over-share children out of this step's admission and preempts the newest
children of a family that holds more than its share while others wait."""

from __future__ import annotations

import logging
import time

from vllm.v1.request import Request, RequestStatus

from vllm_seqhooks.fair_share import Entry, plan

# Under vLLM's "vllm" logger: same handlers, format and VLLM_LOGGING_LEVEL.
logger = logging.getLogger("vllm.seqhooks.scheduler")


class FairShareMixin:
    """Keeps one family from starving the others (see fair_share.py)."""

    def _hold_back_children(self) -> list[Request]:
        """Apply this step's plan; returns the children taken out of the
        waiting queue, to put back after scheduling
        (:meth:`_restore_held`)."""
        waiting: list[Entry] = []
        needed: dict[str, int] = {}
        block_size = self.block_size
        for req in self.waiting:
            if req.status == RequestStatus.WAITING_FOR_STREAMING_REQ:
                continue
            entry = self._entry(req, with_blocks=False)
            waiting.append(entry)
            if not entry.is_child:
                needed[req.request_id] = -(-(req.num_tokens - req.num_computed_tokens + 1)
                                           // block_size)
        if not any(not e.is_child for e in waiting):
            return []
        running = [self._entry(req, with_blocks=True) for req in self.running]
        parked = [self._entry(st.request, with_blocks=True)
                  for st in self._hook_states.values()
                  if st.parked and st.spilled_frontier is None]
        pool = self.kv_cache_manager.block_pool
        decided = plan(waiting, running, max_running=self.max_num_running_reqs,
                       total_blocks=pool.num_gpu_blocks,
                       free_blocks=pool.get_num_free_blocks(),
                       blocks_needed=needed, parked=parked)
        if decided.preempt:
            now = time.time()
            for rid in decided.preempt:
                req = self.requests[rid]
                self.running.remove(req)
                self._preempt_request(req, now)
            self.metrics.inc("fair_share_preemptions", len(decided.preempt))
            logger.debug("fair share (%d slots per family): preempted %s",
                         decided.share, decided.preempt)
        if not decided.hold:
            return []
        hold = set(decided.hold)
        held = [req for req in self.waiting if req.request_id in hold]
        self.waiting.remove_requests(held)
        return held

    def _restore_held(self, held: list[Request]) -> None:
        # FCFS: back at the front, in their order; priority: by the heap.
        self.waiting.prepend_requests(reversed(held))

    def _entry(self, req: Request, *, with_blocks: bool) -> Entry:
        rid = req.request_id
        st = self._hook_states.get(rid)
        family = st.family.root_id if st is not None and st.family is not None else rid
        blocks = 0
        if with_blocks:
            blocks = len(self.kv_cache_manager.get_block_ids(rid)[0])
        return Entry(rid, family, req.priority, rid in self._children, blocks)
