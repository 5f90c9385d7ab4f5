"""The fork/join scheduler: the only module that knows vLLM's scheduler
internals (see ``vllm_seqhooks._vllm_private`` for the list of private names
it relies on, checked at import time and by tests).

Select it with ``scheduler_cls="vllm_seqhooks.scheduler.SeqHooksScheduler"``
and put the configuration in ``additional_config["seqhooks"]`` (the ``LLM``
wrapper and the ``vllm serve`` flags do both). ``SeqHooksScheduler`` builds
the async or the sync variant, whichever vLLM chose for this engine.

Lifecycle of a request with hooks (see docs/lifecycle.md):

* sampled tokens are scanned by a :class:`SpecialTokenProcessor`;
* a closed payload spawns a child ``Request`` (fork: the parent's tokens up to
  the end of the payload, sharing its KV blocks through the prefix cache);
* ``<sync>`` with open children parks the parent through vLLM's
  streaming-session path (status ``WAITING_FOR_STREAMING_REQ``: KV blocks and
  computed tokens kept);
* when its last open child ends, the children's output tokens are appended
  after ``<sync>`` as new prompt tokens (``_update_request_as_session``), so
  only those are prefilled, and shown to the frontend as the parent's output;
* children's outputs never leave EngineCore; a parent's final output carries
  its hook trace in ``kv_transfer_params["seqhooks"]``.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason
from vllm.v1.request import Request, RequestStatus, StreamingUpdate

from vllm_seqhooks import _vllm_private
from vllm_seqhooks.batch_order import grouped_order
from vllm_seqhooks.config import (
    ADDITIONAL_CONFIG_KEY,
    WORKER_EXTENSION_QUALNAME,
    SpecialKwargs,
    SpecialKwargsError,
    parse_request_overrides,
)
from vllm_seqhooks.metrics import ENV_DIR as METRICS_ENV_DIR
from vllm_seqhooks.metrics import HookMetrics
from vllm_seqhooks.dependencies import (
    ABORTED,
    CHILD_KEY_ARG,
    FAILED,
    FINISHED,
    SAMPLED_BEFORE_ARG,
    DependencyManager,
    JoinRecord,
    build_trace,
    derive_seed,
)
from vllm_seqhooks.tokens import (
    PayloadClosed,
    PromiseIgnored,
    SpecialTokenProcessor,
    SyncReached,
)

_vllm_private.check()

# Under vLLM's "vllm" logger: same handlers, format and VLLM_LOGGING_LEVEL.
logger = logging.getLogger("vllm.seqhooks.scheduler")

#: extra_args keys the scheduler writes for the worker side (e.g. the
#: scripted-token logits processor of vllm_seqhooks.testing).
TRACE_KEY = "seqhooks"

_FINISH_STATUS = {
    RequestStatus.FINISHED_STOPPED,
    RequestStatus.FINISHED_LENGTH_CAPPED,
    RequestStatus.FINISHED_REPETITION,
}


@dataclass
class _HookState:
    """Per-request fork/join bookkeeping kept by the scheduler."""

    request: Request
    scanner: SpecialTokenProcessor | None
    orig_prompt_len: int
    orig_max_tokens: int
    orig_min_tokens: int
    sampled: int = 0
    #: Set while the request is parked because it finished with open children
    #: (rule 5): the status it finishes with once they are merged.
    final_status: RequestStatus | None = None
    final_stop_reason: int | str | None = None
    #: Position of the token that stopped the request (EOS / stop token).
    stop_pos: int | None = None
    parked: bool = False
    spilled_frontier: int | None = None
    #: The join whose prefill is being counted, until the parent samples.
    accounting: JoinRecord | None = None
    first_scheduled: bool = False
    preempted_at_stop: bool = False
    child_max_tokens: int | None = None
    separator: tuple[int, ...] = ()


class SeqHooksMixin:
    """Fork/join on top of vLLM's ``Scheduler`` (or ``AsyncScheduler``)."""

    # Empty, read-only defaults: a scheduler built without __init__ (as some
    # of vLLM's own tests do, with object.__new__) behaves as stock vLLM.
    # __init__ replaces each with a per-instance object.
    _hook_states: Mapping[str, _HookState] = MappingProxyType({})
    _children: Mapping[str, Request] = MappingProxyType({})
    _accounting: Mapping[str, _HookState] = MappingProxyType({})
    _park_pending: frozenset[str] = frozenset()
    _parked_this_step: frozenset[str] = frozenset()
    _ended_children: frozenset[str] = frozenset()
    _pending_outputs: tuple = ()
    _ready_joins: tuple = ()
    _requeue_after_step: tuple = ()
    _num_parked = 0
    _children_starved = False
    _order_output_by_family = False
    deps = DependencyManager()
    metrics = HookMetrics("-", "-", None, mirror=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        vllm_config = self.vllm_config
        hooks = SpecialKwargs.from_additional_config(vllm_config.additional_config)
        if hooks is None:
            raise ValueError(
                "SeqHooksScheduler needs additional_config['"
                f"{ADDITIONAL_CONFIG_KEY}'] (a SpecialKwargs dict); use "
                "vllm_seqhooks.LLM(special_kwargs=...) or the vllm serve flags"
            )
        if not hooks.is_resolved:
            hooks = _resolve_in_engine(hooks, vllm_config)
        hooks.check_vocab(vllm_config.model_config.get_vocab_size())
        self.hooks = hooks
        #: Reorder each scheduler output by family: the V2 runner batches
        #: requests in the output's order (the V1 runner keeps a persistent
        #: batch, grouped in the worker; see vllm_seqhooks.worker).
        self._order_output_by_family = (
            hooks.batch_order == "family" and bool(getattr(self, "use_v2_model_runner", False))
        )
        if (hooks.batch_order == "family" and not self._order_output_by_family
                and vllm_config.parallel_config.worker_extension_cls
                != WORKER_EXTENSION_QUALNAME):
            # The user's own worker extension replaced ours, which would
            # install the order in each worker process: install it here,
            # which covers a worker running in this process.
            _vllm_private.install_family_batch_order()
        self.deps = DependencyManager()
        self._hook_states: dict[str, _HookState] = {}
        #: Ids of live child requests (outputs filtered from EngineCore).
        self._children: dict[str, Request] = {}
        #: Requests that stop in this step and must be parked, not finished.
        self._park_pending: set[str] = set()
        self._parked_this_step: set[str] = set()
        #: Outputs (request_id -> (client_index, output)) made outside
        #: update_from_output, flushed by the next one.
        self._pending_outputs: list[tuple[int, EngineCoreOutput]] = []
        self._ready_joins: list[str] = []
        self._accounting: dict[str, _HookState] = {}
        self._num_parked = 0
        self._requeue_after_step: list[Request] = []
        #: Children that ended in this step (their outputs are still filtered).
        self._ended_children: set[str] = set()
        self._tokenizer = None
        self._token_cache: dict[str, tuple[int, ...]] = {}
        model_name = vllm_config.model_config.served_model_name
        if isinstance(model_name, (list, tuple)):
            model_name = model_name[0]
        self.metrics = HookMetrics(
            engine=str(vllm_config.parallel_config.data_parallel_index),
            model_name=str(model_name or vllm_config.model_config.model),
            directory=os.environ.get(METRICS_ENV_DIR),
        )
        logger.info(
            "sequence hooks on: sync=%s promise=%s promise_end=%s context=%s "
            "merge=%s max_child_depth=%s max_children_per_request=%s",
            hooks.sync_token_id,
            hooks.promise_token_id,
            hooks.promise_end_token_id,
            hooks.child_context,
            hooks.merge_strategy,
            hooks.max_child_depth,
            hooks.max_children_per_request,
        )

    # ------------------------------------------------------------ requests
    def add_request(self, request: Request) -> None:
        super().add_request(request)
        try:
            self._init_hook_state(request)
        except Exception:  # never fail a request the engine already queued
            logger.exception("%s: sequence hooks off for this request", request.request_id)

    def _init_hook_state(self, request: Request) -> None:
        if request.request_id in self._hook_states or request.pooling_params:
            return
        if request.resumable:
            # vLLM's own streaming-input sessions park and resume through the
            # same path; hooks are not combined with them.
            return
        sp = request.sampling_params
        if sp is None:
            return
        try:
            per_request = parse_request_overrides(sp.extra_args)
        except SpecialKwargsError as exc:
            # The frontend validates these; a request that reached the engine
            # without it runs without hooks rather than failing the engine.
            logger.warning("%s: %s; sequence hooks off for this request",
                           request.request_id, exc)
            return
        if per_request.get("enabled", True) is False:
            return
        node = self.deps.get(request.request_id)
        depth = node.depth if node is not None else 0
        max_depth = min(self.hooks.max_child_depth,
                        per_request.get("max_child_depth", self.hooks.max_child_depth))
        max_children = min(
            self.hooks.max_children_per_request,
            per_request.get("max_children_per_request", self.hooks.max_children_per_request),
        )
        scanner = None
        if depth < max_depth and max_children > 0:
            scanner = SpecialTokenProcessor(
                self.hooks.sync_token_id,
                self.hooks.promise_token_id,
                self.hooks.promise_end_token_id,
                max_promises=max_children,
            )
        self._hook_states[request.request_id] = _HookState(
            request=request,
            scanner=scanner,
            orig_prompt_len=request.num_prompt_tokens,
            orig_max_tokens=request.max_tokens,
            orig_min_tokens=sp.min_tokens,
            child_max_tokens=per_request.get("child_max_tokens", self.hooks.child_max_tokens),
            separator=self._separator(per_request.get("merge_separator")),
        )

    def _separator(self, text: str | None) -> tuple[int, ...]:
        """Token ids of a per-request merge separator (cached), or the
        server's when there is none or no tokenizer to encode it with."""
        default = tuple(self.hooks.merge_separator_token_ids or ())
        if text is None or text == self.hooks.merge_separator:
            return default
        ids = self._token_cache.get(text)
        if ids is None:
            if self._tokenizer is None and not self.vllm_config.model_config.skip_tokenizer_init:
                from vllm.tokenizers import cached_tokenizer_from_config

                self._tokenizer = cached_tokenizer_from_config(self.vllm_config.model_config)
            if self._tokenizer is None:
                logger.warning("seqhooks_merge_separator needs a tokenizer "
                               "(skip_tokenizer_init is set); using the server's")
                return default
            ids = tuple(self._tokenizer.encode(text, add_special_tokens=False))
            if len(self._token_cache) < 1024:
                self._token_cache[text] = ids
        return ids

    def finish_requests(
        self, request_ids: str | Iterable[str] | None, finished_status: RequestStatus
    ) -> list[Request]:
        if request_ids is None:
            finished = super().finish_requests(None, finished_status)
            for req in finished:
                self._forget(req.request_id)
            return finished
        if isinstance(request_ids, str):
            request_ids = (request_ids,)
        ids = list(request_ids)
        # Aborting a request aborts its whole subtree.
        expanded: list[str] = []
        seen: set[str] = set()
        for rid in ids:
            for r in (rid, *self.deps.subtree(rid)):
                if r not in seen:
                    seen.add(r)
                    expanded.append(r)
        finished = super().finish_requests(expanded, finished_status)
        for req in finished:
            rid = req.request_id
            if rid in self._children:
                self._child_ended(req, ABORTED if finished_status ==
                                  RequestStatus.FINISHED_ABORTED else FAILED, None)
        for rid in ids:
            node = self.deps.get(rid)
            if node is not None and node.parent_id is None:
                self._drop_tree(rid)
        if self._ready_joins:
            gone = {req.request_id for req in finished}
            self._ready_joins = [r for r in self._ready_joins if r not in gone]
        self._publish_metrics()
        return finished

    # ------------------------------------------------------------ sampling
    def _update_request_with_output(
        self, request: Request, new_token_ids: list[int], is_stale: bool = False
    ) -> tuple[list[int], bool]:
        st = self._hook_states.get(request.request_id)
        if st is not None and st.scanner is not None and len(new_token_ids) > 1:
            self._trim_after_sync(st, new_token_ids, is_stale)
        start = request.num_tokens
        offered = len(new_token_ids)
        was_preempted = request.status == RequestStatus.PREEMPTED
        new_token_ids, stopped = super()._update_request_with_output(
            request, new_token_ids, is_stale
        )
        if st is None or not new_token_ids:
            return new_token_ids, stopped
        if stopped and len(new_token_ids) < offered and not is_stale:
            # vLLM stopped at a token before the last (speculative decoding).
            # A finished request never computes again, but one that parks
            # for its children resumes from its frontier: count the tokens
            # vLLM cut as rejected drafts, as _trim_after_sync does.
            _count_as_rejected(request, offered - len(new_token_ids))
        st.preempted_at_stop = was_preempted
        st.sampled += len(new_token_ids)
        if st.accounting is not None:
            self._accounting.pop(request.request_id, None)
            st.accounting = None
        scanner = st.scanner
        if scanner is None:
            if stopped and self.deps.has_open_children(request.request_id):
                self._park(st, stopped_by_finish=True)
            return new_token_ids, stopped
        for ev in scanner.feed(new_token_ids, start):
            if isinstance(ev, PayloadClosed):
                self._spawn(st, ev)
            elif isinstance(ev, PromiseIgnored):
                self._ignore_promise(st, ev.pos, ev.reason)
            elif isinstance(ev, SyncReached) and self.deps.has_open_children(
                request.request_id
            ):
                # _trim_after_sync made this <sync> the step's last token.
                self._park(st, stopped_by_finish=stopped)
                return new_token_ids, True
        if stopped:
            end = request.num_tokens
            if request.status == RequestStatus.FINISHED_STOPPED:
                end -= 1  # the EOS / stop token is not part of a payload
            for ev in scanner.finish(end):
                self._spawn(st, ev)
            if self.deps.has_open_children(request.request_id):
                self._park(st, stopped_by_finish=True)
        return new_token_ids, stopped

    def _trim_after_sync(self, st: _HookState, new_token_ids: list[int], is_stale: bool) -> None:
        """Several tokens in one step (speculative decoding): drop those after
        a ``<sync>`` that will park the request, before vLLM appends them,
        checks them for a stop, or caches blocks holding them. The parent
        resumes after the merge; the dropped tokens count as rejected drafts
        (vLLM's own rollback of ``num_computed_tokens`` and, under async
        scheduling, of the output placeholders)."""
        cut = self._parking_sync_offset(st, new_token_ids)
        if cut is None:
            return
        drop = len(new_token_ids) - cut - 1
        if drop <= 0:
            return
        del new_token_ids[cut + 1:]
        if not is_stale:
            _count_as_rejected(st.request, drop)
        logger.debug("%s: %d tokens sampled after <sync> dropped", st.request.request_id, drop)

    def _parking_sync_offset(self, st: _HookState, new_token_ids: list[int]) -> int | None:
        """Index in ``new_token_ids`` of the first ``<sync>`` that parks the
        request (it has open children then, counting those that payloads
        closing earlier in the same tokens will spawn), or None. Changes
        nothing: it scans with a copy of the request's scanner."""
        scanner = st.scanner
        if scanner is None or not scanner.may_fire(new_token_ids):
            return None
        start = st.request.num_tokens
        has_children = self.deps.has_open_children(st.request.request_id)
        for ev in scanner.copy().feed(new_token_ids, start):
            if isinstance(ev, PayloadClosed):
                has_children = has_children or self._spawn_refusal(ev) is None
            elif isinstance(ev, SyncReached) and has_children:
                return ev.pos - start
        return None

    def update_draft_token_ids(self, draft_token_ids) -> None:
        super().update_draft_token_ids(draft_token_ids)
        if not self._num_parked:
            return
        # The drafter proposed for every request of the step, the parent that
        # just parked included; its drafts continue text that the merge will
        # replace, and would be scheduled (and verified for nothing) when it
        # resumes.
        for rid in draft_token_ids.req_ids:
            st = self._hook_states.get(rid)
            if st is not None and st.parked:
                st.request.spec_token_ids = []

    def _park(self, st: _HookState, *, stopped_by_finish: bool) -> None:
        request = st.request
        if stopped_by_finish:
            st.final_status = request.status
            st.final_stop_reason = request.stop_reason
            if request.status == RequestStatus.FINISHED_STOPPED:
                st.stop_pos = request.num_tokens - 1
        else:
            request.status = RequestStatus.FINISHED_STOPPED
        request.stop_reason = None
        if st.preempted_at_stop:
            # vLLM preempted the request while this step was in flight: its
            # blocks are gone (num_computed_tokens == 0) and vLLM takes it out
            # of every queue after this step. Park it as spilled: it resumes
            # through the prefix cache, and is queued again after the step.
            st.spilled_frontier = request.num_tokens - (0 if stopped_by_finish else 1)
            self._requeue_after_step.append(request)
        st.parked = True
        self._num_parked += 1
        # The worker drops its state for the parked request (freeing its
        # model-runner slot); it is re-sent in full when the request resumes.
        self.finished_req_ids.add(request.request_id)
        self.deps.block(request.request_id)
        self._park_pending.add(request.request_id)
        self._parked_this_step.add(request.request_id)
        if self.deps.ready_to_join(request.request_id):
            self._ready_joins.append(request.request_id)

    def _unpark(self, st: _HookState) -> None:
        if st.parked:
            st.parked = False
            self._num_parked -= 1

    def _free_request(self, request: Request, *args: Any, **kwargs: Any):
        # A child's state lives until its parent has taken its output
        # (_child_ended); any other request's goes with the request.
        if request.request_id not in self._children:
            self._drop_state(request.request_id)
        return super()._free_request(request, *args, **kwargs)

    def _handle_stopped_request(self, request: Request) -> bool:
        if request.request_id not in self._park_pending:
            return super()._handle_stopped_request(request)
        self._park_pending.discard(request.request_id)
        was_resumable, request.resumable = request.resumable, True
        try:
            finished = super()._handle_stopped_request(request)
        finally:
            request.resumable = was_resumable
        assert not finished
        return False

    # ------------------------------------------------------------- spawning
    def _ignore_promise(self, st: _HookState, pos: int, reason: str) -> None:
        node = self.deps.ensure_root(st.request.request_id)
        node.ignored_promises.append({"position": pos, "reason": reason})
        self.metrics.inc("promises_ignored", 1)
        logger.debug("%s: promise at %d ignored (%s)", st.request.request_id, pos, reason)

    def _spawn_refusal(self, ev: PayloadClosed) -> str | None:
        """Why a closed payload spawns no child (None: it spawns one)."""
        hooks = self.hooks
        if hooks.child_context == "fork":
            prompt_len = ev.context_end
        else:
            prompt_len = (len(hooks.child_prompt_prefix_token_ids or ())
                          + (ev.end - ev.start)
                          + len(hooks.child_prompt_suffix_token_ids or ()))
            if prompt_len == 0:
                return "empty_payload"
        if prompt_len >= self.max_model_len:
            return "max_model_len"
        return None

    def _spawn(self, st: _HookState, ev: PayloadClosed) -> None:
        parent = st.request
        hooks = self.hooks
        refusal = self._spawn_refusal(ev)
        if refusal is not None:
            self._ignore_promise(st, ev.start - 1, refusal)
            return
        tokens = parent.all_token_ids
        payload = list(tokens[ev.start : ev.end])
        if hooks.child_context == "fork":
            prompt = list(tokens[: ev.context_end])
        else:
            prompt = [
                *(hooks.child_prompt_prefix_token_ids or ()),
                *payload,
                *(hooks.child_prompt_suffix_token_ids or ()),
            ]
        room = self.max_model_len - len(prompt)
        budget = st.child_max_tokens
        if budget is None:
            # The parent's budget left when it sampled the closing token
            # (with speculative decoding, tokens after it may be in this step).
            sampled_after = max(0, parent.num_tokens - 1 - ev.end)
            budget = max(1, st.orig_max_tokens - (st.sampled - sampled_after))
        budget = min(int(budget), room)
        self.deps.ensure_root(parent.request_id)
        child_id = self.deps.new_child_id(parent.request_id)
        while child_id in self.requests:  # a client request already has that id
            child_id += "~"
        child_node = self.deps.add_child(parent.request_id, child_id, payload, len(prompt))
        sp = parent.sampling_params.clone()
        sp.n = 1
        sp.max_tokens = budget
        extra = dict(sp.extra_args or {})
        extra.pop(SAMPLED_BEFORE_ARG, None)
        extra[CHILD_KEY_ARG] = child_node.key
        sp.extra_args = extra
        if sp.seed is not None:
            sp.seed = derive_seed(sp.seed, child_node.key)
        child = Request(
            request_id=child_id,
            prompt_token_ids=prompt,
            sampling_params=sp,
            pooling_params=None,
            client_index=parent.client_index,
            # A child queues at its parent's place (priority policy orders by
            # arrival time), ahead of requests that arrived after the parent.
            arrival_time=parent.arrival_time,
            lora_request=parent.lora_request,
            cache_salt=parent.cache_salt,
            priority=parent.priority,
            trace_headers=parent.trace_headers,
            block_hasher=parent._block_hasher,
        )
        self._children[child_id] = child
        self.add_request(child)
        self._queue_first(child)
        self.metrics.inc("children_spawned", 1)
        self.metrics.inc("fork_prompt_tokens", len(prompt))
        logger.debug(
            "%s spawned %s (key %s, %d prompt tokens, budget %d)",
            parent.request_id, child_id, child_node.key, len(prompt), budget,
        )

    def _queue_first(self, child: Request) -> None:
        """Children are admitted before requests that have not started.

        A parked parent holds KV blocks until its children finish; admitting
        new parents ahead of waiting children fills the cache with parked
        families whose children then run a few at a time. With FCFS the child
        moves to the front of the waiting queue (with the priority policy its
        parent's arrival time already orders it so)."""
        queue = self.waiting
        if isinstance(queue, deque) and queue and queue[-1] is child:
            queue.pop()
            queue.prepend_request(child)

    # ---------------------------------------------------------- scheduling
    def schedule(self, *args: Any, **kwargs: Any):
        self._maybe_spill()
        # vLLM counts parked streaming sessions as holding a model-runner
        # slot. Parked parents do not: the worker dropped their state when
        # they parked (see _park). Counting them would keep their own
        # children out of the batch (deadlock with few slots).
        parked = self._num_parked
        if parked:
            self.num_waiting_for_streaming_input -= parked
        try:
            out = super().schedule(*args, **kwargs)
        finally:
            if parked:
                self.num_waiting_for_streaming_input += parked
        if self._accounting or self._children:
            self._account(out)
        if self._children and self._order_output_by_family:
            _order_by_family(out.num_scheduled_tokens)
        self._children_starved = bool(self._children) and self._child_left_waiting(out)
        return out

    def _child_left_waiting(self, out) -> bool:
        """A child is still waiting although the step had room for it (token
        budget and sequence slots): it did not get KV blocks."""
        if out.total_num_scheduled_tokens >= self.max_num_scheduled_tokens:
            return False
        if len(self.running) >= self.max_num_running_reqs:
            return False
        for req in self.waiting:
            if req.status == RequestStatus.WAITING_FOR_STREAMING_REQ:
                continue
            return req.request_id in self._children
        return False

    def _account(self, out) -> None:
        scheduled = out.num_scheduled_tokens
        drafts = out.scheduled_spec_decode_tokens
        for rid in list(self._accounting):
            n = scheduled.get(rid)
            if not n:
                continue
            # Draft positions (vLLM pads a resumed decode with placeholder
            # drafts) are verified, not prefilled.
            n -= len(drafts.get(rid, ()))
            st = self._accounting[rid]
            rec = st.accounting
            if rec is None:
                self._accounting.pop(rid, None)
                continue
            if rec.prefilled_tokens is None:
                rec.prefilled_tokens = 0
                rec.reused_tokens = st.request.num_computed_tokens - n
                self.metrics.inc("join_reused_tokens", rec.reused_tokens)
            rec.prefilled_tokens += n
            self.metrics.inc("join_prefill_tokens", n)
            if not st.request.is_prefill_chunk:
                self._accounting.pop(rid, None)
        for rid, child in self._children.items():
            st = self._hook_states.get(rid)
            if st is None or st.first_scheduled:
                continue
            n = scheduled.get(rid)
            if not n:
                continue
            st.first_scheduled = True
            cached = child.num_computed_tokens - n
            node = self.deps.get(rid)
            if node is not None:
                node.cached_prompt_tokens = cached
            self.metrics.inc("fork_cached_tokens", cached)

    def _preempt_request(self, request: Request, *args: Any, **kwargs: Any):
        self.metrics.inc("preemptions", 1)
        return super()._preempt_request(request, *args, **kwargs)

    # ---------------------------------------------------------------- spill
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
        holders = [
            st for st in self._hook_states.values()
            if st.parked and st.spilled_frontier is None
            and st.request.status == RequestStatus.WAITING_FOR_STREAMING_REQ
            and st.request.num_computed_tokens > 0
        ]
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
        for st in reversed(list(self._hook_states.values())):
            req = st.request
            if (not st.parked or st.spilled_frontier is not None
                    or req.status != RequestStatus.WAITING_FOR_STREAMING_REQ
                    or req.num_computed_tokens == 0 or req.request_id == head_parent):
                continue
            node = self.deps.get(req.request_id)
            if node is None:
                continue
            started = False
            for cid in node.open_children:
                child = self._children.get(cid)
                if child is not None and (child.num_computed_tokens > 0
                                          or child.status == RequestStatus.RUNNING):
                    started = True
                    break
            if not started:
                self._spill(st)
                return

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
        need = -(-(head.num_tokens - head.num_computed_tokens + 1) // block_size)
        free = self.kv_cache_manager.block_pool.get_num_free_blocks()
        return free < need + 1

    def _spill(self, st: _HookState) -> None:
        req = st.request
        self.kv_holding_waiting.remove_request(req)
        self._free_request_blocks(req)
        st.spilled_frontier = req.num_computed_tokens
        req.num_computed_tokens = 0
        self.waiting.add_request(req)
        self.metrics.inc("spills", 1)
        logger.info(
            "spilled parked request %s (%d computed tokens) to let its "
            "children run", req.request_id, st.spilled_frontier,
        )

    # --------------------------------------------------------------- output
    def update_from_output(self, scheduler_output, model_runner_output):
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        if self._requeue_after_step:
            for req in self._requeue_after_step:
                if req.status == RequestStatus.WAITING_FOR_STREAMING_REQ:
                    self.waiting.add_request(req)
                    self.deferred_waiting.add(req)
            self._requeue_after_step = []
        if not (self._children or self._parked_this_step or self._pending_outputs
                or self._ready_joins or self._ended_children or self.deps.nodes):
            return outputs
        parked_now = self._parked_this_step
        self._parked_this_step = set()
        for client_index, eco in list(outputs.items()):
            kept: list[EngineCoreOutput] = []
            for out in eco.outputs:
                rid = out.request_id
                child = self._children.get(rid)
                if child is not None or rid in self._ended_children:
                    # Children's outputs never leave EngineCore.
                    if (child is not None and out.finish_reason is not None
                            and rid not in parked_now):
                        state = FINISHED if out.finish_reason in (
                            FinishReason.STOP, FinishReason.LENGTH,
                            FinishReason.REPETITION) else FAILED
                        self._child_ended(child, state, out.finish_reason)
                    continue
                if rid in parked_now:
                    out.finish_reason = None
                    out.stop_reason = None
                    st = self._hook_states.get(rid)
                    if st is not None and st.stop_pos is not None and out.new_token_ids:
                        # Hold the stop token back: the frontend drops the
                        # last token of a stop-terminated output from the
                        # text, so it must come after the merged tokens.
                        out.new_token_ids = list(out.new_token_ids[:-1])
                elif out.finish_reason is not None and rid in self.deps:
                    self._attach_trace(out)
                kept.append(out)
            eco.outputs = kept
            if eco.finished_requests:
                eco.finished_requests = {
                    r for r in eco.finished_requests
                    if r not in self._children and r not in self._ended_children
                }
        # Joins (may cascade: a child finishing after its own join).
        while self._ready_joins:
            rid = self._ready_joins.pop(0)
            self._join(rid)
        for client_index, out in self._pending_outputs:
            eco = outputs.get(client_index)
            if eco is None:
                eco = outputs[client_index] = EngineCoreOutputs()
            merged = False
            for existing in eco.outputs:
                if existing.request_id == out.request_id and existing.finish_reason is None:
                    existing.new_token_ids = list(existing.new_token_ids) + list(out.new_token_ids)
                    existing.finish_reason = out.finish_reason
                    existing.stop_reason = out.stop_reason
                    existing.kv_transfer_params = out.kv_transfer_params
                    merged = True
                    break
            if not merged:
                eco.outputs.append(out)
        self._pending_outputs = []
        self._ended_children.clear()
        self._publish_metrics()
        return outputs

    def _child_ended(self, child: Request, state: str, finish_reason) -> None:
        rid = child.request_id
        if rid not in self._children:
            return
        del self._children[rid]
        self._ended_children.add(rid)
        st = self._drop_state(rid, None)
        self._accounting.pop(rid, None)
        tokens: list[int] = []
        if state == FINISHED and st is not None:
            tokens = self._contribution(st)
        self.metrics.child_ended(state)
        reason = str(finish_reason) if finish_reason is not None else state
        node = self.deps.get(rid)
        if node is not None and st is not None:
            node.sampled_tokens = st.sampled
        parent_id = self.deps.child_ended(rid, state, tokens, reason)
        if parent_id is not None:
            self._ready_joins.append(parent_id)

    def _contribution(self, st: _HookState) -> list[int]:
        """What a finished request contributes to its parent: everything it
        generated after its original prompt (merged grandchildren included),
        without the EOS / stop token that ended it."""
        req = st.request
        tokens = list(req.all_token_ids[st.orig_prompt_len:])
        stop_pos = st.stop_pos
        if stop_pos is None and req.status == RequestStatus.FINISHED_STOPPED and (
            isinstance(req.stop_reason, int) or req.stop_reason is None
        ):
            stop_pos = req.num_tokens - 1
        if stop_pos is not None:
            idx = stop_pos - st.orig_prompt_len
            if 0 <= idx < len(tokens):
                del tokens[idx]
        return tokens

    def _join(self, rid: str) -> None:
        st = self._hook_states.get(rid)
        if st is None or not st.parked:
            return
        req = st.request
        hooks = self.hooks
        node = self.deps.get(rid)
        if node is not None and node.blocked_since is not None:
            self.metrics.observe_park(time.time() - node.blocked_since)
        merged, _children = self.deps.take_merge(
            rid, st.separator, hooks.failed_child_marker_token_ids,
        )
        if hooks.merge_strategy == "none":
            merged = []
        node = self.deps.get(rid)
        record = node.joins[-1]
        self._unpark(st)
        self.metrics.inc("joins", 1)
        # Room left under max_model_len (rule 7).
        room = self.max_model_len - req.num_tokens
        truncated = len(merged) > room
        if truncated:
            merged = merged[: max(room, 0)]
            record.truncated = True
            self.metrics.inc("truncated_merges", 1)
        record.merged_tokens = len(merged)
        self.metrics.inc("merged_tokens", len(merged))
        remaining = st.orig_max_tokens - st.sampled
        finish_status = st.final_status
        if finish_status is None and (truncated or len(merged) >= room or remaining <= 0):
            finish_status = RequestStatus.FINISHED_LENGTH_CAPPED
        if finish_status is not None:
            self._finish_after_join(st, merged, finish_status)
            return
        # Resume: [<sync>] + merged become prompt tokens; only they prefill.
        if st.spilled_frontier is not None:
            req.num_computed_tokens = st.spilled_frontier
        sp = req.sampling_params.clone()
        sp.max_tokens = remaining
        sp.min_tokens = max(0, st.orig_min_tokens - st.sampled)
        extra = dict(sp.extra_args or {})
        extra[SAMPLED_BEFORE_ARG] = st.sampled
        sp.extra_args = extra
        sync_token = req.all_token_ids[-1]
        # Never extend the caller's own prompt list in place.
        req.prompt_token_ids = list(req.prompt_token_ids)
        update = StreamingUpdate(
            mm_features=None,
            prompt_token_ids=[sync_token, *merged],
            max_tokens=remaining,
            arrival_time=req.arrival_time,
            sampling_params=sp,
        )
        self._update_request_as_session(req, update)
        if st.spilled_frontier is not None:
            # Re-admit through the prefix cache: recompute what was evicted.
            req.num_computed_tokens = 0
            st.spilled_frontier = None
        req.stop_reason = None
        st.accounting = record
        self._accounting[rid] = st
        if merged and rid not in self._children:
            self._pending_outputs.append(
                (req.client_index, EngineCoreOutput(request_id=rid, new_token_ids=list(merged)))
            )
        logger.debug("%s joined %d children: %d merged tokens", rid,
                     len(record.children), len(merged))

    def _finish_after_join(
        self, st: _HookState, merged: list[int], status: RequestStatus
    ) -> None:
        req = st.request
        rid = req.request_id
        is_child = rid in self._children
        contribution = self._contribution(st) + merged if is_child else None
        stop_reason = st.final_stop_reason
        self._unpark(st)
        if st.spilled_frontier is not None:
            req.num_computed_tokens = st.spilled_frontier
            st.spilled_frontier = None
        super().finish_requests([rid], status)
        if is_child:
            del self._children[rid]
            self._ended_children.add(rid)
            self._drop_state(rid, None)
            self.metrics.child_ended(FINISHED)
            reason = str(RequestStatus.get_finished_reason(status))
            node = self.deps.get(rid)
            if node is not None:
                node.sampled_tokens = st.sampled
            parent_id = self.deps.child_ended(rid, FINISHED, contribution, reason)
            if parent_id is not None:
                self._ready_joins.append(parent_id)
            return
        held = [req.all_token_ids[st.stop_pos]] if st.stop_pos is not None else []
        out = EngineCoreOutput(
            request_id=rid,
            new_token_ids=[*merged, *held],
            finish_reason=RequestStatus.get_finished_reason(status),
            stop_reason=stop_reason,
        )
        self._attach_trace(out)
        self._drop_state(rid, None)
        self._pending_outputs.append((req.client_index, out))

    # ---------------------------------------------------------------- trace
    def _attach_trace(self, out: EngineCoreOutput) -> None:
        rid = out.request_id
        node = self.deps.get(rid)
        if node is None or node.parent_id is not None:
            return
        nodes = self.deps.pop_tree(rid)
        trace = build_trace(nodes)
        params = dict(out.kv_transfer_params or {})
        params[TRACE_KEY] = trace
        out.kv_transfer_params = params
        self._drop_state(rid, None)
        for n in nodes[1:]:
            self._children.pop(n.request_id, None)
            self._drop_state(n.request_id, None)

    def _drop_tree(self, rid: str) -> None:
        for n in self.deps.pop_tree(rid):
            self._forget(n.request_id)

    def _drop_state(self, rid: str, default: None = None) -> _HookState | None:
        st = self._hook_states.pop(rid, default)
        if st is not None:
            self._unpark(st)
        return st

    def _forget(self, rid: str) -> None:
        self._drop_state(rid)
        self._children.pop(rid, None)
        self._accounting.pop(rid, None)
        self._park_pending.discard(rid)
        node = self.deps.get(rid)
        if node is not None and node.parent_id is None:
            self.deps.pop_tree(rid)

    def get_num_unfinished_requests(self) -> int:
        # A join decided outside update_from_output (a child aborted from
        # outside) is delivered by the next step: keep the engine stepping.
        pending = len(self._ready_joins) + len(self._pending_outputs)
        return super().get_num_unfinished_requests() + pending

    def _publish_metrics(self) -> None:
        self.metrics.set_gauges(open_children=len(self._children),
                                parked_requests=self._num_parked)
        self.metrics.maybe_write(force=not self.requests)

    def shutdown(self) -> None:
        self.metrics.remove()
        super().shutdown()

    @property
    def hook_stats(self) -> dict[str, int]:
        """Counters since start (a copy): see vllm_seqhooks.metrics.COUNTERS."""
        out = dict(self.metrics.counters)
        out.update({f"children_{k}": v for k, v in self.metrics.ended.items()})
        return out

    # ------------------------------------------------------------- queries
    def hook_state_sizes(self) -> dict[str, int]:
        """Sizes of the scheduler's fork/join state (for leak checks)."""
        return {
            "nodes": len(self.deps),
            "hook_states": len(self._hook_states),
            "children": len(self._children),
            "accounting": len(self._accounting),
            "pending_outputs": len(self._pending_outputs),
            "parked": self._num_parked,
            "requests": len(self.requests),
        }


def _order_by_family(num_scheduled_tokens: dict[str, int]) -> None:
    """Put the step's requests in family order (the same dict, reordered)."""
    order = grouped_order(list(num_scheduled_tokens))
    if order is None:
        return
    counts = dict(num_scheduled_tokens)
    num_scheduled_tokens.clear()
    for rid in order:
        num_scheduled_tokens[rid] = counts[rid]


def unsupported_engine(vllm_config, kv_cache_config=None) -> str | None:
    """Why hooks cannot run on this engine (None when they can).

    * State that is not attention KV (Mamba, linear attention, hybrids):
      a parked parent resumes from its KV frontier, but recurrent state is
      updated in place by every token the model saw, including the step
      already in flight after ``<sync>`` under async scheduling and the
      drafts cut after it, and it cannot be rolled back to the frontier.
    * KV connectors (``kv_transfer_config``): vLLM tells a connector that a
      request finished when it stops, and a parked parent stops at
      ``<sync>`` to resume later; the connector would offload or hand off,
      and free, the KV of a request that is still alive.
    """
    model_config = vllm_config.model_config
    if vllm_config.kv_transfer_config is not None:
        return ("sequence hooks cannot be combined with kv_transfer_config (KV "
                "connectors treat a parent parked at <sync> as finished); start the "
                "engine without --kv-transfer-config, or without hook flags")
    stateful = [
        what for what, flag in (("hybrid", "is_hybrid"), ("recurrent-state", "has_inner_state"),
                                ("attention-free", "is_attention_free"))
        if getattr(model_config, flag, False)
    ]
    if kv_cache_config is not None:
        for group in kv_cache_config.kv_cache_groups:
            if not _is_attention_spec(group.kv_cache_spec):
                stateful.append(type(group.kv_cache_spec).__name__)
    if stateful:
        return (f"sequence hooks need a model whose only per-token state is attention "
                f"KV; {model_config.model} has {', '.join(dict.fromkeys(stateful))} "
                "state (Mamba / linear attention), which a request parked at <sync> "
                "cannot roll back to its resume point; serve it without hook flags")
    return None


def _is_attention_spec(spec) -> bool:
    from vllm.v1.kv_cache_interface import AttentionSpec, UniformTypeKVCacheSpecs

    if isinstance(spec, UniformTypeKVCacheSpecs):
        return all(_is_attention_spec(s) for s in spec.kv_cache_specs.values())
    return isinstance(spec, AttentionSpec)


def _count_as_rejected(request: Request, num_tokens: int) -> None:
    """Roll back the bookkeeping of ``num_tokens`` sampled tokens that will
    not be kept, as vLLM's ``update_from_output`` does for rejected drafts."""
    if request.num_computed_tokens > 0:
        request.num_computed_tokens -= num_tokens
    if request.num_output_placeholders > 0:
        request.num_output_placeholders -= num_tokens


def _resolve_in_engine(hooks: SpecialKwargs, vllm_config) -> SpecialKwargs:
    from vllm.tokenizers import cached_tokenizer_from_config

    tokenizer = cached_tokenizer_from_config(vllm_config.model_config)
    return hooks.resolve(tokenizer, vllm_config.model_config.get_vocab_size())


class SeqHooksSyncScheduler(SeqHooksMixin, Scheduler):
    """Fork/join on vLLM's synchronous scheduler."""


class SeqHooksAsyncScheduler(SeqHooksMixin, AsyncScheduler):
    """Fork/join on vLLM's async scheduler (overlapped steps)."""


class SeqHooksScheduler:
    """Factory given to vLLM as ``scheduler_cls``: builds the async variant
    when vLLM turned async scheduling on for this engine, else the sync one."""

    def __new__(cls, *args: Any, **kwargs: Any):
        vllm_config = kwargs.get("vllm_config", args[0] if args else None)
        kv_cache_config = kwargs.get("kv_cache_config", args[1] if len(args) > 1 else None)
        refusal = unsupported_engine(vllm_config, kv_cache_config)
        if refusal is not None:
            raise ValueError(f"vllm-seqhooks: {refusal}")
        impl = (
            SeqHooksAsyncScheduler
            if vllm_config.scheduler_config.async_scheduling
            else SeqHooksSyncScheduler
        )
        return impl(*args, **kwargs)


SCHEDULER_QUALNAME = f"{__name__}.SeqHooksScheduler"
