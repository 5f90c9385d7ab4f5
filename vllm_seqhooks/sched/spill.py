"""KV pressure: a parked parent holds KV blocks its children may need; it is
spilled (its blocks go back to the pool as prefix-cache entries) when
nothing can run otherwise, or when children wait for blocks while it only
waits. A spilled parent resumes through the prefix cache."""

from __future__ import annotations

import logging

from vllm.v1.request import RequestStatus

from vllm_seqhooks.kv_admission import blocks_for
from vllm_seqhooks.sched.state import HookState

# Under vLLM's "vllm" logger: same handlers, format and VLLM_LOGGING_LEVEL.
logger = logging.getLogger("vllm.seqhooks.scheduler")


class SpillMixin:
    """Spills parked parents under KV pressure."""

    def _child_left_waiting(self, out) -> bool:
        """A child is still waiting although the step had room for it (token
        budget and sequence slots): it did not get KV blocks."""
        if out.total_num_scheduled_tokens >= self.max_num_scheduled_tokens:
            return False
        if len(self.running) >= self.max_num_running_reqs:
            return False
        for req in self.waiting:
            if (req.status == RequestStatus.WAITING_FOR_STREAMING_REQ
                    or req.request_id in self._held_this_step):
                continue
            return req.request_id in self._children
        return False

    def _maybe_spill(self) -> None:
        """Free the KV blocks of parked parents when nothing can run otherwise.

        A parked parent keeps its blocks; when no request is running and the
        next waiting request cannot get blocks, the engine would spin forever.
        Spilled blocks go back to the free pool as prefix-cache entries, so a
        resumed parent recomputes only what was evicted in between.
        """
        if self.running:
            if self._children_starved:
                self._spill_idle_holder()
            return
        holders = self._holders()
        if not holders:
            return
        if not self._waiting_needs_blocks():
            return
        # Spill the most recently parked first (its children are the newest).
        for st in reversed(holders):
            self._spill(st)
            if not self._waiting_needs_blocks():
                break

    def _spill_idle_holder(self) -> None:
        """Children wait for KV blocks while parked parents hold theirs:
        spill one parked parent none of whose children has started (its
        blocks only wait; they stay in the prefix cache for its children
        and itself), skipping the parent of the first waiting child."""
        head_parent = None
        for req in self.waiting:
            if req.status != RequestStatus.WAITING_FOR_STREAMING_REQ:
                node = self.deps.get(req.request_id)
                head_parent = node.parent_id if node is not None else None
                break
        for st in reversed(self._holders()):
            node = self.deps.get(st.request.request_id)
            if node is None or st.request.request_id == head_parent:
                continue
            if not any(self._started(cid) for cid in node.open_children):
                self._spill(st)
                return

    def _holders(self) -> list[HookState]:
        """Parked parents that hold KV blocks, oldest first."""
        return [st for st in self._hook_states.values()
                if st.parked and st.spilled_frontier is None
                and st.request.status == RequestStatus.WAITING_FOR_STREAMING_REQ
                and st.request.num_computed_tokens > 0]

    def _started(self, child_id: str) -> bool:
        child = self._children.get(child_id)
        return child is not None and (child.num_computed_tokens > 0
                                      or child.status == RequestStatus.RUNNING)

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
        block_size = self.block_size
        need = blocks_for(head.num_tokens - head.num_computed_tokens + 1, block_size)
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
