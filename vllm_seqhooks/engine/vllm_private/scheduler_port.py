"""The vLLM scheduler as the engine's parts see it: the one object through
which they read vLLM's scheduler state and act on it.

The hook scheduler is a subclass of vLLM's ``Scheduler``; its parts
(:mod:`vllm_seqhooks.engine`'s spawning, joins, splicing, ...) do not receive
it. Each receives a :class:`SchedulerPort` instead, with the fork/join state
and the other parts it uses, explicitly. The port names every member of
vLLM's scheduler a part reads or calls, so that a part cannot reach another
part (or a hook method) through the scheduler, and a difference between vLLM
releases lands here, not across the parts. Its private calls are those of
:mod:`.scheduler_calls` and :mod:`.sessions` (signatures and assumptions
checked at start-up).
"""

from __future__ import annotations

from typing import Any, Callable

from vllm_seqhooks.engine.vllm_private.scheduler import hash_lookahead_tokens
from vllm_seqhooks.engine.vllm_private.scheduler_calls import (
    free_blocks_to_prefix_cache, free_held_blocks, preempt)
from vllm_seqhooks.engine.vllm_private.sessions import (
    drop_worker_state, requeue, resume_session)


class SchedulerPort:
    """vLLM's scheduler state and calls, by name. ``finish`` is vLLM's own
    ``finish_requests`` (no subtree, no hook bookkeeping) and
    ``update_request`` vLLM's own ``_update_request_with_output``, both
    bound to the hook scheduler past its overrides."""

    def __init__(self, sched: Any, finish: Callable[..., list],
                 update_request: Callable[..., tuple[list[int], bool]]) -> None:
        self._sched = sched
        self.finish = finish
        self.update_request = update_request
        #: Fixed at start-up.
        self.block_size: int = sched.block_size
        self.hash_block_size: int = sched.hash_block_size
        #: Tokens past a block that its hash covers (vLLM 0.33, EAGLE).
        self.hash_lookahead: int = hash_lookahead_tokens(sched)
        self.max_model_len: int = sched.max_model_len
        self.max_num_running_reqs: int = sched.max_num_running_reqs
        self.max_num_active_reqs: int = sched.max_num_active_reqs
        self.kv_cache_manager = sched.kv_cache_manager
        self.block_pool = sched.kv_cache_manager.block_pool

    # ------------------------------------------------------ queues (live)
    @property
    def requests(self) -> dict[str, Any]:
        return self._sched.requests

    @property
    def running(self) -> list:
        """vLLM's running list (vLLM replaces it in some steps: read it here
        each time, never keep it)."""
        return self._sched.running

    @property
    def waiting(self):
        return self._sched.waiting

    @property
    def kv_holding_waiting(self):
        return self._sched.kv_holding_waiting

    @property
    def num_waiting_for_streaming_input(self) -> int:
        return self._sched.num_waiting_for_streaming_input

    # ------------------------------------------------------------- KV
    @property
    def enable_caching(self) -> bool:
        return self.kv_cache_manager.enable_caching

    def num_free_blocks(self) -> int:
        return self.block_pool.get_num_free_blocks()

    @property
    def num_blocks(self) -> int:
        return self.block_pool.num_gpu_blocks

    def block_ids(self, request_id: str) -> list[int]:
        """The KV blocks ``request_id`` holds (one KV-cache group)."""
        return self.kv_cache_manager.get_block_ids(request_id)[0]

    # ----------------------------------------------------------- calls
    def preempt(self, request: Any, timestamp: float) -> None:
        """Take running ``request`` out of ``running`` and preempt it."""
        self._sched.running.remove(request)
        preempt(self._sched, request, timestamp)

    def free_blocks_to_prefix_cache(self, request: Any) -> None:
        free_blocks_to_prefix_cache(self._sched, request)

    def free_held_blocks(self, request: Any) -> None:
        free_held_blocks(self._sched, request)

    def drop_worker_state(self, request_id: str) -> None:
        drop_worker_state(self._sched, request_id)

    def grammar_accepts(self, request: Any, tokens: list[int]) -> bool:
        """Advance ``request``'s grammar (structured outputs) over ``tokens``
        it did not sample; False when the grammar rejects them. True for a
        request without one."""
        manager = self._sched.structured_output_manager
        # (checked first: xgrammar logs an error, "please file an issue", for
        # tokens its accept_tokens rejects)
        if len(manager.validate_tokens(request, list(tokens))) < len(tokens):
            return False
        return manager.accept_tokens(request, list(tokens))

    def resume_session(self, request: Any, update: Any) -> None:
        resume_session(self._sched, request, update)

    def requeue(self, request: Any) -> None:
        requeue(self._sched, request)
