"""The fork/join scheduler: with its parts in ``vllm_seqhooks.sched``, the
only code that knows vLLM's scheduler internals (see
``vllm_seqhooks._vllm_private`` for the list of private names it relies on,
checked at import time and by tests).

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
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutput
from vllm.v1.request import Request, RequestStatus

from vllm_seqhooks import _vllm_private
from vllm_seqhooks.batch_order import grouped_order
from vllm_seqhooks.config import (
    ADDITIONAL_CONFIG_KEY,
    WORKER_EXTENSION_QUALNAME,
    SpecialKwargs,
)
from vllm_seqhooks.dependencies import ABORTED, FAILED, DependencyManager
from vllm_seqhooks.metrics import ENV_DIR as METRICS_ENV_DIR
from vllm_seqhooks.metrics import HookMetrics
from vllm_seqhooks.sched.accounting import AccountingMixin
from vllm_seqhooks.sched.admission import AdmissionMixin
from vllm_seqhooks.sched.engine_support import unsupported_engine
from vllm_seqhooks.sched.fairness import FairShareMixin
from vllm_seqhooks.sched.joins import TRACE_KEY, JoinMixin  # noqa: F401 (TRACE_KEY: re-exported)
from vllm_seqhooks.sched.limits import LimitsMixin
from vllm_seqhooks.sched.sampling import SamplingMixin
from vllm_seqhooks.sched.spawning import SpawningMixin
from vllm_seqhooks.sched.speculative import SpeculativeMixin
from vllm_seqhooks.sched.spill import SpillMixin
from vllm_seqhooks.sched.state import HookState

_vllm_private.check()

# Under vLLM's "vllm" logger: same handlers, format and VLLM_LOGGING_LEVEL.
logger = logging.getLogger("vllm.seqhooks.scheduler")


class SeqHooksMixin(
    SamplingMixin,
    AdmissionMixin,
    SpawningMixin,
    SpeculativeMixin,
    JoinMixin,
    AccountingMixin,
    SpillMixin,
    LimitsMixin,
    FairShareMixin,
):
    """Fork/join on top of vLLM's ``Scheduler`` (or ``AsyncScheduler``): the
    lifecycle and the state; the parts live in :mod:`vllm_seqhooks.sched`."""

    # Empty, read-only defaults: a scheduler built without __init__ (as some
    # of vLLM's own tests do, with object.__new__) behaves as stock vLLM.
    # __init__ replaces each with a per-instance object.
    _hook_states: Mapping[str, HookState] = MappingProxyType({})
    _children: Mapping[str, Request] = MappingProxyType({})
    _accounting: Mapping[str, HookState] = MappingProxyType({})
    _park_pending: frozenset[str] = frozenset()
    _parked_this_step: frozenset[str] = frozenset()
    _ended_children: frozenset[str] = frozenset()
    _pending_outputs: tuple = ()
    _ready_joins: tuple = ()
    _requeue_after_step: tuple = ()
    _families: Mapping[str, Any] = MappingProxyType({})
    _timed_families: frozenset = frozenset()
    _families_to_cut: tuple = ()
    _child_deadlines: Mapping[str, float] = MappingProxyType({})
    _held_this_step: frozenset[str] = frozenset()
    _num_parked = 0
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
        self._codec = None
        if hooks.tag_format is not None:
            self._text_codec().table  # at start-up, not at the first request
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
        self._hook_states: dict[str, HookState] = {}
        #: Ids of live child requests (outputs filtered from EngineCore).
        self._children: dict[str, Request] = {}
        #: Requests that stop in this step and must be parked, not finished.
        self._park_pending: set[str] = set()
        self._parked_this_step: set[str] = set()
        #: Outputs (request_id -> (client_index, output)) made outside
        #: update_from_output, flushed by the next one.
        self._pending_outputs: list[tuple[int, EngineCoreOutput]] = []
        self._ready_joins: list[str] = []
        self._accounting: dict[str, HookState] = {}
        self._num_parked = 0
        self._requeue_after_step: list[Request] = []
        #: Children that ended in this step (their outputs are still filtered).
        self._ended_children: set[str] = set()
        #: Family ledgers by root request id (vllm_seqhooks.family).
        self._families: dict[str, Any] = {}
        self._timed_families: set = set()
        self._families_to_cut: list = []
        #: Child request id -> clock reading at which it times out.
        self._child_deadlines: dict[str, float] = {}
        #: Waiting requests vLLM skips in this step's admission (fair share).
        self._held_this_step: set[str] = set()
        model_name = vllm_config.model_config.served_model_name
        if isinstance(model_name, (list, tuple)):
            model_name = model_name[0]
        self.metrics = HookMetrics(
            engine=str(vllm_config.parallel_config.data_parallel_index),
            model_name=str(model_name or vllm_config.model_config.model),
            directory=os.environ.get(METRICS_ENV_DIR),
        )
        logger.info("sequence hooks on: %s", hooks.summary())

    # ------------------------------------------------------------ requests
    def add_request(self, request: Request) -> None:
        super().add_request(request)
        try:
            self._init_hook_state(request)
        except Exception:  # never fail a request the engine already queued
            logger.exception("%s: sequence hooks off for this request", request.request_id)


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
        finished = super().finish_requests(self.deps.with_subtrees(ids), finished_status)
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

    def _free_request(self, request: Request, *args: Any, **kwargs: Any):
        # A child's state lives until its parent has taken its output
        # (_child_ended); any other request's goes with the request (and
        # its family's ledger, unless its trace still needs it).
        rid = request.request_id
        if rid not in self._children:
            self._drop_state(rid)
            if rid not in self.deps:
                self._drop_family(rid)
        return super()._free_request(request, *args, **kwargs)

    # ---------------------------------------------------------- scheduling
    def schedule(self, *args: Any, **kwargs: Any):
        if self._families:
            self._enforce_limits()
        self._maybe_spill()
        if self._children and (self.kv_cache_manager.block_pool.get_num_free_blocks()
                               < len(self.running)):
            # Not a free block for each running request: vLLM may preempt
            # this step, the last running request first (FCFS; the priority
            # policy takes the latest arrival, a child's being its family's).
            # In arrival order the newest family goes first and whole, and
            # the context its children share is freed with it.
            self.running.sort(key=_arrival)
        if self._children and self.hooks.fair_share and self.waiting:
            self._held_this_step.update(self._fair_share_holds())
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
            if self._held_this_step:
                self._held_this_step.clear()
        if self._accounting or self._children:
            self._account(out)
        if self._children and self._order_output_by_family:
            _order_by_family(out.num_scheduled_tokens)
        return out

    def _handle_blocked_waiting_request(self, request: Request) -> bool:
        if request.request_id in self._held_this_step:
            return False  # vLLM skips it for this step, keeping its place
        return super()._handle_blocked_waiting_request(request)

    def _preempt_request(self, request: Request, *args: Any, **kwargs: Any):
        self.metrics.inc("preemptions", 1)
        out = super()._preempt_request(request, *args, **kwargs)
        if request.request_id in self._children:
            self._requeue_child(request)
        return out

    # ---------------------------------------------------------------- state

    def _drop_tree(self, rid: str) -> None:
        for n in self.deps.pop_tree(rid):
            self._forget(n.request_id)  # the root's: its family too

    def _drop_family(self, rid: str):
        family = self._families.pop(rid, None)
        if family is not None:
            self._timed_families.discard(family)
        return family

    def _drop_state(self, rid: str, default: None = None) -> HookState | None:
        st = self._hook_states.pop(rid, default)
        if st is not None:
            self._unpark(st)
            node = self.deps.get(rid)
            if node is not None:
                node.sampled_tokens = st.sampled
        return st

    def _forget(self, rid: str) -> None:
        self._drop_state(rid)
        self._children.pop(rid, None)
        self._accounting.pop(rid, None)
        self._child_deadlines.pop(rid, None)
        self._park_pending.discard(rid)
        node = self.deps.get(rid)
        if node is not None and node.parent_id is None:
            self.deps.pop_tree(rid)
        self._drop_family(rid)

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
            "families": len(self._families),
            "child_deadlines": len(self._child_deadlines),
            "requests": len(self.requests),
        }


def _arrival(request: Request) -> float:
    return request.arrival_time


def _order_by_family(num_scheduled_tokens: dict[str, int]) -> None:
    """Put the step's requests in family order (the same dict, reordered)."""
    order = grouped_order(list(num_scheduled_tokens))
    if order is None:
        return
    counts = dict(num_scheduled_tokens)
    num_scheduled_tokens.clear()
    for rid in order:
        num_scheduled_tokens[rid] = counts[rid]


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
