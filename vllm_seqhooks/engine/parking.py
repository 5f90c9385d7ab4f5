"""Parking: a request stops at ``<sync>`` (or a fork tag) with open
children, or finishes with open children, and waits for them through vLLM's
streaming-session path (status ``WAITING_FOR_STREAMING_REQ``: its KV blocks
and computed tokens kept) instead of finishing.

A parked request waits outside vLLM's queues: vLLM would look at every
waiting streaming session at every step (and skip it), a cost per parked
parent per step; it is queued again when its join resumes it
(:meth:`Parking.unpark_to_queue`). Every use of vLLM's session path, with
what it relies on, is in :mod:`vllm_seqhooks.engine.vllm_private.sessions`."""

from __future__ import annotations

from vllm.v1.request import Request, RequestStatus

from vllm_seqhooks.engine.state import ForkJoinState, HookState
from vllm_seqhooks.engine.vllm_private import SchedulerPort


class Parking:
    """Parks requests that wait for their children (their phase in
    ``fork_join``), spills parked ones' KV blocks, and queues joined ones
    again, in vLLM's scheduler (``vllm``)."""

    def __init__(self, fork_join: ForkJoinState, vllm: SchedulerPort) -> None:
        self.fork_join = fork_join
        self.vllm = vllm

    def park(self, st: HookState, *, stopped_by_finish: bool) -> None:
        """Park ``st``'s request in this step: at a ``<sync>`` or fork tag it
        just sampled, or (``stopped_by_finish``) at its end, which it
        reaches again once its children are merged."""
        fj = self.fork_join
        request = st.request
        rid = request.request_id
        if st.scanner is not None and st.scanner.needs_history:
            st.scanner.fed_to = None  # (what its join gives it is not sampled: never scanned)
        if stopped_by_finish:
            st.final_status = request.status
            st.final_stop_reason = request.stop_reason
            if request.status == RequestStatus.FINISHED_STOPPED:
                st.stop_pos = request.num_tokens - 1
        else:
            request.status = RequestStatus.FINISHED_STOPPED
        request.stop_reason = None
        # vLLM preempted the request while this step was in flight: its
        # blocks are gone (num_computed_tokens == 0). It parks spilled: it
        # resumes through the prefix cache.
        fj.lifecycle.park(st, spilled_at=request.num_tokens - (0 if stopped_by_finish else 1)
                          if st.preempted_at_stop else None)
        # The worker drops its state for the parked request (freeing its
        # model-runner slot); it is re-sent in full when the request resumes.
        self.vllm.drop_worker_state(rid)
        if fj.tree.ready_to_join(rid):
            fj.ready_joins.append(rid)

    def spill(self, st: HookState) -> None:
        """A parked parent gives its KV blocks back to the pool (as
        prefix-cache entries, see :meth:`give_back_blocks`): SPILLED, it
        resumes through the prefix cache."""
        self.fork_join.lifecycle.spill(st, self.give_back_blocks(st.request))

    def give_back_blocks(self, request: Request) -> int:
        """``request``'s KV blocks go back to the pool, its full blocks
        staying in the prefix cache until evicted; it has no computed
        tokens left. Returns how many it had."""
        self.vllm.free_blocks_to_prefix_cache(request)
        frontier, request.num_computed_tokens = request.num_computed_tokens, 0
        return frontier

    def unpark_to_queue(self, request: Request) -> None:
        """The joined ``request`` (vLLM's session updated: status WAITING)
        is queued as vLLM queues a waiting request: among those holding KV
        blocks if it holds some, else among the others."""
        self.vllm.requeue(request)
