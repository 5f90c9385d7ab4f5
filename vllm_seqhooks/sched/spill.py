"""KV pressure: a parked parent holds KV blocks that waiting requests may
need; it is spilled (its blocks go back to the pool as prefix-cache
entries) when the next waiting request cannot get blocks. A spilled parent
resumes through the prefix cache."""

from __future__ import annotations

import logging

from vllm.v1.request import RequestStatus

from vllm_seqhooks.kv_blocks import blocks_to_start
from vllm_seqhooks.sched.state import HookState

# Under vLLM's "vllm" logger: same handlers, format and VLLM_LOGGING_LEVEL.
logger = logging.getLogger("vllm.seqhooks.scheduler")


class SpillMixin:
    """Spills parked parents under KV pressure."""

    def _maybe_spill(self) -> None:
        """Free the KV blocks of parked parents when the next waiting request
        cannot get blocks.

        A parked parent keeps its blocks so that it resumes on them, which
        is right while the cache has room. When the request vLLM would admit
        next (a child, a resumed parent or a new request) cannot get its
        blocks, the most recently parked parents give theirs back, one by
        one until it can: their full blocks stay in the prefix cache (the
        ones their running children share stay in use), so a spilled parent
        recomputes at its join only its last partial block and whatever
        was evicted in between. A client-side loop frees every parent's
        blocks at every round; this does it only under pressure. Without
        it, with nothing running and every block parked, the engine would
        spin forever.
        """
        if len(self.running) >= self.max_num_running_reqs or not self._waiting_needs_blocks():
            return
        for st in reversed(self._holders()):
            self._spill(st)
            if not self._waiting_needs_blocks():
                break

    def _holders(self) -> list[HookState]:
        """Parked parents that hold KV blocks, oldest first."""
        return [st for st in self._hook_states.values()
                if st.parked and st.spilled_frontier is None
                and st.request.status == RequestStatus.WAITING_FOR_STREAMING_REQ
                and st.request.num_computed_tokens > 0]

    def _waiting_needs_blocks(self) -> bool:
        head = None
        for queue in (self.kv_holding_waiting, self.waiting):
            for req in queue:
                if req.status == RequestStatus.WAITING_FOR_STREAMING_REQ:
                    continue
                head = req
                break
            if head is not None:
                break
        if head is None:
            return False
        need = blocks_to_start(head.num_tokens, head.num_computed_tokens, self.block_size)
        free = self.kv_cache_manager.block_pool.get_num_free_blocks()
        return free < need + 1

    def _release_blocks(self, st: HookState) -> None:
        """A parked parent gives its KV blocks back to the pool (as prefix-cache
        entries) and will resume through the prefix cache."""
        req = st.request
        self.kv_holding_waiting.remove_request(req)
        self._free_request_blocks(req)
        st.spilled_frontier = req.num_computed_tokens
        req.num_computed_tokens = 0
        self.waiting.add_request(req)

    def _spill(self, st: HookState) -> None:
        req = st.request
        self._release_blocks(st)
        self.metrics.inc("spills", 1)
        logger.info(
            "spilled parked request %s (%d computed tokens) to let its "
            "children run", req.request_id, st.spilled_frontier,
        )
