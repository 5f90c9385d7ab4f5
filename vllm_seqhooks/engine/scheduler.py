"""The fork/join scheduler: every vLLM scheduler method the hooks override, in
one class, each reading top to bottom.

Select it with ``scheduler_cls=SCHEDULER_CLASS_PATH`` (``vllm_seqhooks.engine``)
and put the configuration in ``additional_config["seqhooks"]`` (the ``LLM``
wrapper and the ``vllm serve`` flags do both). :class:`SeqHooksScheduler`
builds the async or the sync variant, whichever vLLM chose for this engine.
Every private vLLM name used here is listed and checked in
:mod:`vllm_seqhooks.engine.vllm_private`.

A request's life (see docs/lifecycle.md):

* ``add_request``: its hook settings and scanner (:mod:`.admission`);
* ``schedule``: family limits enforced (:mod:`.family_limits`), parked
  parents spilled under KV pressure (:mod:`.kv_pressure`), over-share
  children held back (:mod:`.fair_share`), join prefill and fork cache hits
  counted (:mod:`.accounting`);
* ``_update_request_with_output``: a step with hook work (:mod:`.sampling`)
  cuts what it sampled at a parking tag (:mod:`.speculative`) and to its
  family's budget, scans it (:mod:`vllm_seqhooks.formats`), and a closed
  payload or a fork spawns children (:mod:`.spawning`); ``<sync>`` with
  open children, or its end, parks it (:mod:`.parking`);
* ``update_from_output``: children's outputs stay in EngineCore
  (:mod:`.step_outputs`); a parked parent whose children ended takes their
  merged outputs and resumes, or finishes with its trace (:mod:`.joins`).

The parts receive what they use (never this scheduler); vLLM's scheduler
state and calls reach them through ``vllm_private.SchedulerPort``.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from typing import Any, Iterable

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

from vllm_seqhooks.config.special_kwargs import SpecialKwargs
from vllm_seqhooks.core.batch_order import keep_families_together
from vllm_seqhooks.core.request_tree import ABORTED, FAILED
from vllm_seqhooks.engine import WORKER_EXTENSION_CLASS_PATH, patches, vllm_private
from vllm_seqhooks.engine.accounting import Accounting
from vllm_seqhooks.engine.admission import Admission
from vllm_seqhooks.engine.agreed_clock import spmd_engine
from vllm_seqhooks.engine.engine_args import engine_hooks, served_model_name
from vllm_seqhooks.engine.engine_support import unsupported_engine, unsupported_splice
from vllm_seqhooks.engine.fair_share import FairShare
from vllm_seqhooks.engine.family_limits import FamilyLimits
from vllm_seqhooks.engine.joins import Joins
from vllm_seqhooks.engine.kv_pressure import KVPressure
from vllm_seqhooks.engine.lifecycle import Phase
from vllm_seqhooks.engine.logprob_rows import LogprobRows
from vllm_seqhooks.engine.metrics import ENV_DIR as METRICS_ENV_DIR
from vllm_seqhooks.engine.metrics import HookMetrics
from vllm_seqhooks.engine.parking import Parking
from vllm_seqhooks.engine.spawning import Spawning
from vllm_seqhooks.engine.sampling import Sampling
from vllm_seqhooks.engine.speculative import Speculative
from vllm_seqhooks.engine.splicing import Splicing
from vllm_seqhooks.engine.state import ForkJoinState
from vllm_seqhooks.engine.step_outputs import StepOutputs

vllm_private.check()

# Under vLLM's "vllm" logger: same handlers, format and VLLM_LOGGING_LEVEL.
logger = logging.getLogger("vllm.seqhooks.scheduler")


class SeqHooksMixin:
    """Fork/join on top of vLLM's ``Scheduler`` (or ``AsyncScheduler``)."""

    # A scheduler built without __init__ (as some of vLLM's own tests do,
    # with object.__new__) has no hooks and empty state: it behaves as stock
    # vLLM. __init__ gives each scheduler its own.
    fork_join = ForkJoinState()
    metrics = HookMetrics("-", "-", None, mirror=False)
    _order_output_by_family = False
    #: V2 runner: ``running`` was left in arrival order (families together).
    _running_in_arrival_order = False
    #: vLLM's own ``_update_request_with_output`` is bound on the instance
    #: (the last step had no hook work: update_from_output).
    _stock_updates = False
    #: No fork/join work in flight or pending (``plain_now``, noted after
    #: each step with hook work and at each request's admission): a step is
    #: vLLM's own but for the look for watched tokens in update_from_output.
    #: Set only by ``_set_plain``, which binds :data:`PLAIN_BOUND` with it.
    _plain = False
    #: While plain, these are bound on the instance (``_plain_methods``):
    #: vLLM's own ``schedule`` and ``get_num_unfinished_requests``, and an
    #: ``update_from_output`` that only looks for a watched token before
    #: vLLM's own. The fewer objects a plain step reads the better: after
    #: the GPU's step they are cold.
    PLAIN_BOUND = ("schedule", "get_num_unfinished_requests", "update_from_output")
    #: The watched ids the bound ``update_from_output`` looks for.
    _plain_watched: frozenset[int] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        vllm_config = self.vllm_config
        self.hooks = engine_hooks(vllm_config)
        #: vLLM's own ``_update_request_with_output`` (bound once: the
        #: common step calls it without looking it up).
        self._vllm_update_request = vllm_private.vllm_request_update(super())
        #: vLLM's own step methods, bound once for plain steps.
        vllm_own = super()
        self._vllm_step_methods = {name: getattr(vllm_own, name) for name in self.PLAIN_BOUND}
        self.fork_join = ForkJoinState()
        if isinstance(self.waiting, deque) and not self.waiting:  # FCFS policy
            children = self.fork_join.children
            self.waiting = vllm_private.children_first_queue(
                lambda request: request.request_id in children)
        self.metrics = HookMetrics(
            engine=str(vllm_config.parallel_config.data_parallel_index),
            model_name=served_model_name(vllm_config.model_config),
            directory=os.environ.get(METRICS_ENV_DIR),
        )
        self._build_parts(vllm_config)
        #: Whether a request with logprobs was admitted (children's rows are
        #: then kept for their joins).
        self.logprobs_seen = False
        if self.hooks.tag_format is not None:
            self.admission.text_codec().table  # at start-up, not at the first request
        batch_by_family = self.hooks.batch_order == "family"
        #: The V2 runner batches requests in the scheduler output's order;
        #: the V1 runner keeps a persistent batch, grouped in the worker.
        self._order_output_by_family = batch_by_family and bool(
            getattr(self, "use_v2_model_runner", False))
        if (batch_by_family and not self._order_output_by_family
                and vllm_config.parallel_config.worker_extension_cls
                != WORKER_EXTENSION_CLASS_PATH):
            # The user's own worker extension replaced ours, which installs
            # the worker patches in each worker process: install them here,
            # which covers a worker running in this process.
            patches.install_worker_patches()
        self._set_plain(True)
        logger.info("sequence hooks on: %s", self.hooks.summary())

    def _build_parts(self, vllm_config) -> None:
        """The parts: each receives what it reads and the parts it calls;
        vLLM's scheduler only through the port (``vllm_private.SchedulerPort``)."""
        fj, hooks, metrics = self.fork_join, self.hooks, self.metrics
        vllm = vllm_private.SchedulerPort(
            self, finish=super().finish_requests,
            update_request=vllm_private.request_update_for_hooks(super()))
        self.family_limits = FamilyLimits(fj, hooks, metrics, spmd=spmd_engine(vllm_config))
        self.admission = Admission(fj, hooks, self.family_limits, vllm_config.model_config)
        text_codec = self.admission.text_codec
        self.parking = Parking(fj, vllm)
        self.splicing = Splicing(fj, hooks, metrics, vllm, self.parking, text_codec)
        self.spawning = Spawning(fj, hooks, metrics, vllm, self.family_limits, self.splicing,
                                 text_codec, add_request=self.add_request)
        self.speculative = Speculative(fj, self.spawning)
        self.sampling = Sampling(fj, hooks, vllm.update_request, self.family_limits,
                                 self.speculative, self.spawning, self.parking, self.splicing)
        self.logprob_rows = LogprobRows()
        self.joins = Joins(fj, hooks, metrics, vllm, self.family_limits, self.parking,
                           self.splicing, self.logprob_rows, text_codec)
        self.step_outputs = StepOutputs(fj, self.logprob_rows, self.joins.child_ended,
                                        engine=metrics.engine)
        self.kv_pressure = KVPressure(fj, vllm, metrics, self.parking, self.splicing)
        self.fair_share = FairShare(fj, vllm, metrics)
        self.accounting = Accounting(fj, metrics)

    # ------------------------------------------------------------ requests
    def add_request(self, request: Request) -> None:
        if request.sampling_params is not None and request.sampling_params.logprobs is not None:
            self.logprobs_seen = True
        fj = self.fork_join
        if request.request_id not in fj.children:
            fj.arrival_order[request.request_id] = fj.arrivals
            fj.arrivals += 1
        super().add_request(request)
        try:
            self.admission.admit(request)
        except Exception:  # never fail a request the engine already queued
            logger.exception("%s: sequence hooks off for this request", request.request_id)
        if self._plain:  # (a child, or a family with a deadline, has work)
            self._note_plain()

    def finish_requests(
        self, request_ids: str | Iterable[str] | None, finished_status: RequestStatus
    ) -> list[Request]:
        fj = self.fork_join
        if request_ids is None:  # every request (vLLM's pause with mode="abort")
            finished = super().finish_requests(None, finished_status)
            for req in finished:
                fj.forget(req.request_id)
            fj.ready_joins = []
            self._publish_metrics()  # now: a paused engine takes no step until resumed
            return finished
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        # Aborting a request aborts its whole subtree.
        outcome = ABORTED if finished_status == RequestStatus.FINISHED_ABORTED else FAILED
        finished = self._finish_subtrees(ids, finished_status, outcome, None)
        for rid in ids:
            node = fj.tree.get(rid)
            if node is not None and node.parent_id is None:
                fj.drop_tree(rid)
        if fj.ready_joins:
            gone = {req.request_id for req in finished}
            fj.ready_joins = [r for r in fj.ready_joins if r not in gone]
        self._publish_metrics()
        return finished

    def reset_prefix_cache(self, reset_running_requests: bool = False,
                           reset_connector: bool = False) -> bool:
        # vLLM preempts its running requests; parked parents and children
        # held for splice joins hold blocks too (KVPressure.give_back_all).
        if reset_running_requests:
            self.kv_pressure.give_back_all()
        return super().reset_prefix_cache(reset_running_requests, reset_connector)

    def end_children(self, child_ids: Iterable[str], status: RequestStatus, outcome: str,
                     reason: str) -> None:
        """Finish live children (and their subtrees) from inside the
        scheduler: they end with ``outcome``; a parent parked on them joins."""
        self._finish_subtrees(child_ids, status, outcome, reason)
        self._publish_metrics()

    def _finish_subtrees(self, request_ids: Iterable[str], status: RequestStatus,
                         outcome: str, reason: str | None) -> list[Request]:
        finished = super().finish_requests(self.fork_join.tree.with_subtrees(request_ids), status)
        for req in finished:
            if req.request_id in self.fork_join.children:
                self.joins.child_ended(req, outcome, reason)
        return finished

    def _get_local_prefix_cache_hit(self, request: Request, *limit: Any):
        # (``limit``: vLLM 0.33's max_cache_hit_length, vllm_private.releases)
        if not isinstance(self, SeqHooksMixin):  # vLLM's tests call it on a stand-in
            return Scheduler._get_local_prefix_cache_hit(self, request, *limit)
        found = super()._get_local_prefix_cache_hit(request, *limit)
        if self.splicing.enabled and request.request_id in self.fork_join.children:
            return self.splicing.child_context_hit(request, found, *limit)
        return found

    def _free_request(self, request: Request, *args: Any, **kwargs: Any):
        # A child's state lives until its parent has taken its output
        # (joins.child_ended); any other request's goes with the request
        # (and its family's ledger, unless its trace still needs it).
        fj = self.fork_join
        rid = request.request_id
        if rid not in fj.children:
            fj.arrival_order.pop(rid, None)
            self.logprob_rows.forget_family(rid)
            fj.drop_state(rid)
            if rid not in fj.tree:
                fj.drop_family(rid)
        if self.splicing.enabled:
            held = self.splicing.hold(request)  # its parent takes its blocks
            self.splicing.forget(rid)
            if held:
                return super()._free_request(request, delay_free_blocks=True)
        return super()._free_request(request, *args, **kwargs)

    # ---------------------------------------------------------- scheduling
    def plain_now(self) -> bool:
        """No fork/join work in flight or pending, splice joins' included."""
        return self.fork_join.plain and not self.splicing.busy

    def _note_plain(self) -> None:
        if not hasattr(self, "splicing"):
            return  # built without __init__ (some of vLLM's tests): the hook path, always
        plain = self.plain_now()
        if plain is not self._plain or (
                plain and self._plain_watched is not self.fork_join.watched_ids):
            self._set_plain(plain)
        elif plain:
            self._set_stock_updates(True)  # (a plain step is vLLM's update_from_output)

    def _set_plain(self, plain: bool) -> None:
        """Plain steps are vLLM's own but for the look for watched tokens:
        :data:`PLAIN_BOUND` are bound on this instance (and vLLM's own
        per-request update, ``_set_stock_updates``); else ours."""
        if plain:
            self._set_stock_updates(True)
            if not self._plain:
                self._running_in_arrival_order = False  # (vLLM's own steps reorder it)
            self.__dict__.update(self._plain_methods())
        else:
            for name in self.PLAIN_BOUND:
                self.__dict__.pop(name, None)
            self._plain_watched = None
        self._plain = plain

    def _plain_methods(self) -> dict[str, Any]:
        """vLLM's own step methods, but ``update_from_output``: a step in
        which no request sampled one of the watched ids (those of now) is
        vLLM's own; else the hooks' (nothing is loud or has its stop
        watched while plain, so only a watched token can start work)."""
        watched = self._plain_watched = self.fork_join.watched_ids

        def update_from_output(scheduler_output, model_runner_output, _watched=watched,
                               _vllm=self._vllm_step_methods["update_from_output"],
                               _hooks=self._update_from_output_with_hooks):
            for ids in model_runner_output.sampled_token_ids:
                if not _watched.isdisjoint(ids):
                    return _hooks(scheduler_output, model_runner_output, False)
            return _vllm(scheduler_output, model_runner_output)

        return {**self._vllm_step_methods, "update_from_output": update_from_output}

    def schedule(self, *args: Any, **kwargs: Any):
        # (while plain, vLLM's own is bound on the instance: _set_plain)
        fj = self.fork_join
        # (each piece of hook work only when there can be some: a step of
        # plain requests costs what it costs stock vLLM, within a microsecond)
        if fj.families and (fj.child_deadlines or fj.timed_families or fj.families_to_cut):
            for cut in self.family_limits.enforce():
                self.end_children(cut.child_ids, cut.status, cut.outcome, cut.reason)
        if fj.deferred_children:
            self.spawning.spawn_deferred()
        parked = fj.num_parked
        if parked or self.splicing.held:
            self.kv_pressure.maybe_spill()
        if fj.children:
            self.kv_pressure.order_for_preemption()
            if self.hooks.fair_share:
                self.fair_share.hold_over_share()
        # vLLM counts parked streaming sessions as holding a model-runner
        # slot. Parked parents do not: the worker dropped their state when
        # they parked (see parking.park). Counting them would keep their own
        # children out of the batch (deadlock with few slots).
        try:
            if parked:
                with vllm_private.parked_not_waiting(self, parked):
                    out = super().schedule(*args, **kwargs)
            else:
                out = super().schedule(*args, **kwargs)
        finally:
            fj.share_step = None
        if self.splicing.maps or self.splicing.pending:
            self.splicing.attach(out)
        if fj.accounting or fj.children:
            self.accounting.count(out)
        if self._order_output_by_family:
            # Without children every family is one request: nothing to keep
            # together, and vLLM's order stays as it is.
            if fj.children:
                joined = [d.req_id for d in out.scheduled_new_reqs]
                joined += out.scheduled_cached_reqs.resumed_req_ids
                keep_families_together(self.running, joined, self._running_in_arrival_order)
            self._running_in_arrival_order = bool(fj.children)
        return out

    def _handle_blocked_waiting_request(self, request: Request) -> bool:
        if self.fork_join.share_step is not None and self.fair_share.holds_back(request):
            return False  # vLLM skips it for this step, keeping its place
        return super()._handle_blocked_waiting_request(request)

    def _preempt_request(self, request: Request, *args: Any, **kwargs: Any):
        self.metrics.inc("preemptions", 1)
        if request.request_id in self.splicing.maps:
            # Recomputed from its tokens, at its positions: what the prefix
            # cache no longer holds of its spliced paths is counted when
            # computed again (splice_recomputed_tokens).
            self.metrics.inc("splice_recomputes", 1)
        out = super()._preempt_request(request, *args, **kwargs)
        if request.request_id in self.fork_join.children:
            self.spawning.requeue_child(request)
        return out

    # ------------------------------------------------------------ sampling
    def _update_request_with_output(
        self, request: Request, new_token_ids: list[int], is_stale: bool = False
    ) -> tuple[list[int], bool]:
        st = self.fork_join.states.get(request.request_id)
        if st is None:
            return super()._update_request_with_output(request, new_token_ids, is_stale)
        quiet = st.quiet_ids
        if quiet is not None and quiet.isdisjoint(new_token_ids):
            # Nothing to cut, charge, count or scan now: vLLM's own work
            # (the scanner reads these tokens later if it needs them), and
            # the hooks' only if it stops and its stop is watched.
            if not st.watch_stop:
                return self._vllm_update_request(request, new_token_ids, is_stale)
            return self.sampling.update_watching_stop(st, new_token_ids, is_stale)
        new_token_ids, stopped = self.sampling.update_watched(st, new_token_ids, is_stale)
        if not st.charged_per_step:  # (else it stays loud)
            self.fork_join.refresh_quiet(st)
        return new_token_ids, stopped

    def _handle_stopped_request(self, request: Request) -> bool:
        st = self.fork_join.states.get(request.request_id)
        if st is None or st.phase is not Phase.PARKING:
            return super()._handle_stopped_request(request)
        # Parked: kept as vLLM keeps a waiting session, with its blocks; it
        # waits outside vLLM's queues (vllm_private.sessions).
        vllm_private.park_stopped(self, super()._handle_stopped_request, request)
        self.fork_join.lifecycle.kept(st)
        return False

    def update_draft_token_ids(self, draft_token_ids) -> None:
        super().update_draft_token_ids(draft_token_ids)
        if self.fork_join.num_parked:
            self.speculative.drop_parked_drafts(draft_token_ids)

    # -------------------------------------------------------------- output
    def update_from_output(self, scheduler_output, model_runner_output):
        # (while plain, the one bound on the instance: _plain_methods)
        fj = self.fork_join
        stock = not (fj.loud or fj.stop_watch)
        if stock:
            watched = fj.watched_ids
            for ids in model_runner_output.sampled_token_ids:
                if not watched.isdisjoint(ids):
                    stock = False
                    break
        return self._update_from_output_with_hooks(scheduler_output, model_runner_output, stock)

    def _set_stock_updates(self, stock: bool) -> None:
        """``stock``: vLLM's own method serves every request (bound on this
        instance until a step has hook work), so a step in which no request
        has hook work costs what it costs stock vLLM. (super() here: vLLM's
        tests build schedulers without __init__.)"""
        if stock is not self._stock_updates:
            vllm_private.bind_stock_request_updates(self, super() if stock else None)
            self._stock_updates = stock

    def _update_from_output_with_hooks(self, scheduler_output, model_runner_output,
                                       stock: bool):
        """A step that may have hook work (``stock``: no request has any)."""
        fj = self.fork_join
        self._set_stock_updates(stock)
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        if fj.idle:
            self._note_plain()
            return outputs
        parked_now = fj.lifecycle.take_parked_this_step()
        if parked_now:  # (read only on a release that queued them: a generator)
            vllm_private.unqueue_parked(self, (fj.states[rid].request for rid in parked_now
                                               if rid in fj.states))
        if self.logprobs_seen and fj.children:
            self.logprob_rows.keep_children(outputs, fj)
        self.step_outputs.filter_outputs(outputs, parked_now)
        self.joins.join_ready()
        self.step_outputs.deliver_pending(outputs)
        fj.ended_children.clear()
        self._publish_metrics()
        self._note_plain()
        return outputs

    def get_num_unfinished_requests(self) -> int:
        # A join decided outside update_from_output (a child aborted from
        # outside) is delivered by the next step: keep the engine stepping.
        # Parked requests wait outside vLLM's queues (parking), which vLLM
        # subtracts as waiting streaming sessions: they do not count.
        # (While plain, vLLM's own is bound on the instance: _set_plain.)
        fj = self.fork_join
        pending = len(fj.ready_joins) + len(fj.pending_outputs)
        if not fj.num_parked:
            return super().get_num_unfinished_requests() + pending
        with vllm_private.parked_not_waiting(self, fj.num_parked):
            return super().get_num_unfinished_requests() + pending

    def shutdown(self) -> None:
        self.metrics.remove()
        super().shutdown()

    # ------------------------------------------------------------- queries
    def _publish_metrics(self) -> None:
        self.metrics.set_gauges(open_children=len(self.fork_join.children),
                                parked_requests=self.fork_join.num_parked,
                                deferred_children=len(self.fork_join.deferred_children))
        self.metrics.maybe_write(force=not self.requests)

    @property
    def hook_stats(self) -> dict[str, int]:
        """Counters since start (a copy): see vllm_seqhooks.engine.metrics.COUNTERS."""
        out = dict(self.metrics.counters)
        out.update({f"children_{k}": v for k, v in self.metrics.ended.items()})
        return out

    def hook_state_sizes(self) -> dict[str, int]:
        """Sizes of the scheduler's fork/join state (for leak checks)."""
        return {**self.fork_join.sizes(requests=len(self.requests)), **self.splicing.sizes(),
                **self.logprob_rows.sizes()}


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
        hooks = SpecialKwargs.from_additional_config(vllm_config.additional_config)
        if refusal is None and hooks is not None and hooks.join == "splice":
            refusal = unsupported_splice(vllm_config, kv_cache_config)
        if refusal is not None:
            raise ValueError(f"vllm-seqhooks: {refusal}")
        impl = (
            SeqHooksAsyncScheduler
            if vllm_config.scheduler_config.async_scheduling
            else SeqHooksSyncScheduler
        )
        return impl(*args, **kwargs)
