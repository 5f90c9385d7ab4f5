"""KV pressure: a parked parent holds KV blocks that waiting requests may
need; it is spilled (its blocks go back to the pool as prefix-cache entries)
when the next waiting request cannot get blocks, and resumes through the
prefix cache. When vLLM may preempt, the newest family goes first, whole."""

from __future__ import annotations

import logging
from vllm.v1.request import Request, RequestStatus

from vllm_seqhooks.core.kv_blocks import blocks_to_start
from vllm_seqhooks.engine.lifecycle import Phase
from vllm_seqhooks.engine.metrics import HookMetrics
from vllm_seqhooks.engine.parking import Parking
from vllm_seqhooks.engine.splicing import Splicing
from vllm_seqhooks.engine.state import ForkJoinState, HookState
from vllm_seqhooks.engine.vllm_private import SchedulerPort

# Under vLLM's "vllm" logger: same handlers, format and VLLM_LOGGING_LEVEL.
logger = logging.getLogger("vllm.seqhooks.scheduler")


class KVPressure:
    """Spills parked parents and orders preemption under KV pressure."""

    def __init__(self, fork_join: ForkJoinState, vllm: SchedulerPort, metrics: HookMetrics,
                 parking: Parking, splicing: Splicing) -> None:
        self.fork_join = fork_join
        self.vllm = vllm
        self.metrics = metrics
        self.parking = parking
        self.splicing = splicing

    def maybe_spill(self) -> None:
        """Free the KV blocks of parked parents when the next waiting request
        cannot get blocks.

        A parked parent keeps its blocks so that it resumes on them, which
        is right while the cache has room. When the request vLLM would admit
        next (a child, a resumed parent or a new request) cannot get its
        blocks, the most recently parked parents give theirs back, one by
        one until it can: their full blocks stay in the prefix cache (the
        ones their running children share stay in use), so a spilled parent
        recomputes at its join only its last partial block and whatever
        was evicted in between. When nothing runs and that is still not
        enough, children held for splice joins give their blocks back. A
        client-side loop frees every parent's
        blocks at every round; this does it only under pressure. Without
        it, with nothing running and every block parked, the engine would
        spin forever.
        """
        vllm = self.vllm
        if len(vllm.running) >= vllm.max_num_running_reqs or not self._waiting_needs_blocks():
            return
        for st in reversed(self._holders()):
            self.spill(st)
            if not self._waiting_needs_blocks():
                return
        if not vllm.running and self.splicing.held:
            # Nothing runs that could free blocks: the blocks finished
            # children keep for their parents' splice joins go back too.
            self.splicing.release_held_for(self._waiting_needs_blocks)

    def give_back_all(self) -> None:
        """Every parked parent and every child held for a splice join gives
        its KV blocks back (vLLM's ``reset_prefix_cache`` with
        ``reset_running_requests``, which a weight update or a pause asks
        for, preempts the running requests only: the blocks these hold would
        make it fail). The families go on: a spilled parent recomputes its
        context at its join, a splice join re-prefills."""
        for st in self._holders():
            self.spill(st, why="for a prefix-cache reset")
        if self.splicing.held:
            self.splicing.release_held_for(lambda: True, why="a prefix-cache reset")

    def order_for_preemption(self) -> None:
        """When the free blocks cannot give every running request one more,
        vLLM may preempt this step, the last running request first (FCFS;
        the priority policy takes the latest arrival, a child's being its
        family's). In arrival order the newest family goes first and whole,
        and the context its children share is freed with it."""
        running = self.vllm.running
        if self.vllm.num_free_blocks() < len(running):
            running.sort(key=_arrival)

    def _holders(self) -> list[HookState]:
        """Parked parents that hold KV blocks, oldest first."""
        return [st for st in self.fork_join.states.values()
                if st.phase is Phase.PARKED
                and st.request.status == RequestStatus.WAITING_FOR_STREAMING_REQ
                and st.request.num_computed_tokens > 0]

    def _waiting_needs_blocks(self) -> bool:
        vllm = self.vllm
        head = None
        for queue in (vllm.kv_holding_waiting, vllm.waiting):
            for req in queue:
                if req.status == RequestStatus.WAITING_FOR_STREAMING_REQ:
                    continue
                head = req
                break
            if head is not None:
                break
        if head is None:
            return False
        need = blocks_to_start(head.num_tokens, head.num_computed_tokens, vllm.block_size)
        return vllm.num_free_blocks() < need + 1

    def spill(self, st: HookState, why: str = "to let its children run") -> None:
        self.parking.spill(st)
        self.metrics.inc("spills", 1)
        logger.info("spilled parked request %s (%d computed tokens) %s",
                    st.request.request_id, st.spilled_frontier, why)


def _arrival(request: Request) -> float:
    return request.arrival_time
