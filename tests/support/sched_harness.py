"""Drive a V1 scheduler directly, without a model or a worker ("surgical"
scheduler tests, in the style of vLLM's own ``tests/v1/core`` tests).

The harness builds the scheduler offline (:mod:`.sched_setup`: a tiny Llama
``config.json`` written to a temporary directory, no tokenizer, no weights, a
one-group full-attention KV cache; its builders are re-exported here), then
plays the part of EngineCore and of the worker:

* :class:`SchedHarness` ``.step()`` is one ``EngineCore.step`` (sync
  scheduling) or one ``EngineCore.step_with_batch_queue`` with a batch queue of
  two (async scheduling): step N+1 is scheduled *before* the output of step N
  is processed, so the async scheduler's output placeholders are exercised;
* the "worker" (:meth:`SchedHarness.execute`) samples, for every scheduled
  request that is not a non-final prefill chunk, the token its *script* gives
  for the position being sampled.  The index into the script is the one the
  scripted-token logits processor (``vllm_seqhooks.scripted.processor``) uses:
  ``extra_args["seqhooks_sampled_before"] + (position - num_prompt_tokens)``,
  read from the request as scheduled.  So a token depends only on the
  request's id and on how many tokens it had sampled before, like a
  deterministic model: a stale in-flight step and the step that recomputes it
  sample the same token.

With ``num_spec_tokens=k`` (speculative decoding, 1 to 4 draft tokens) the
engine is configured for ngram speculation and the worker returns up to
``1 + len(drafts)`` tokens for a request whose drafts were scheduled: the
script's tokens for the positions being sampled, of which the first
``acceptance(request_id, index, num_drafts)`` drafts are accepted (all of
them by default), the way a verifying model returns the accepted drafts plus
one token of its own. Under sync scheduling the harness proposes the drafts
after each step (``EngineCore.post_step``); under async scheduling they are
the scheduler's placeholders and the worker counts the tokens of the batch
still in flight, as vLLM's worker does.

Everything the scheduler returns is recorded: per-step ``num_scheduled_tokens``
and the :class:`~vllm.v1.engine.EngineCoreOutput` s, with helpers to read the
tokens, finish reasons and the fork/join trace of each request.

Token ids are those of ``vllm_seqhooks.scripted.tiny_model`` (EOS 2,
``<promise>`` 4, ``</promise>`` 5, ``<sync>`` 6, ``"\\n"`` 8 as the merge
separator).  Importing this module imports vLLM.
"""

from __future__ import annotations

import os
from collections import deque
from typing import Any, Callable, Iterable, Sequence

from vllm_seqhooks.config.request_keys import SAMPLED_BEFORE_ARG
from vllm_seqhooks.core.trace import TRACE_KEY  # noqa: F401 (re-exported)
from tests.support.sched_setup import (  # noqa: F401 (re-exported)
    FAILED_MARKER_IDS,
    SEP_ID,
    VOCAB,
    block_hasher,
    default_hooks,
    make_kv_cache_config,
    make_request,
    make_scheduler,
    make_vllm_config,
    tiny_model_dir,
)
from vllm_seqhooks.scripted.tiny_model import (  # noqa: F401 (re-exported)
    EOS_ID,
    PROMISE_END_ID,
    PROMISE_ID,
    SYNC_ID,
)

#: Tokens the "model" produces when a script is exhausted: never a hook
#: token, EOS or the separator.
FILLER_BASE = 20
FILLER_SPAN = 60


def child_id(parent_id: str, index: int) -> str:
    return f"{parent_id}@seqhooks-child{index}"


def filler(request_id: str, index: int) -> int:
    """Deterministic non-hook token for a request past its script."""
    h = sum(ord(c) for c in request_id)
    return FILLER_BASE + (h + 7 * index) % FILLER_SPAN


class StallError(AssertionError):
    """The engine made no progress within the step bound (or went idle)."""


class InvariantError(AssertionError):
    """Scheduler bookkeeping broken (see :func:`check_invariants`)."""


def check_invariants(sched, scheduler_output=None) -> None:
    """Scheduler bookkeeping that must hold between steps.

    * every live request sits in exactly one of ``running``, ``waiting``,
      ``kv_holding_waiting``, except parked ones (waiting for their
      children), which sit in none;
    * ``num_waiting_for_streaming_input`` equals the number of requests with
      status ``WAITING_FOR_STREAMING_REQ``;
    * each request's phase (:mod:`vllm_seqhooks.engine.lifecycle`) is what
      vLLM's state, the request tree and the parked count say
      (:func:`~vllm_seqhooks.engine.lifecycle.lifecycle_problems`), and the
      quiet path's indexes are what the requests' fields say
      (``ForkJoinState.quiet_problems``);
    * a request's token list starts with its prompt, and it never has more
      computed tokens than tokens (+ output placeholders, + the draft tokens
      ``scheduler_output`` scheduled for it, when given).
    """
    from vllm.v1.request import RequestStatus

    fork_join = getattr(sched, "fork_join", None)  # (absent on stock vLLM)
    hook_states = fork_join.states if fork_join is not None else {}
    counts: dict[str, int] = {}
    for queue in (sched.running, sched.waiting, sched.kv_holding_waiting):
        for req in queue:
            counts[req.request_id] = counts.get(req.request_id, 0) + 1
    problems = []
    for rid, req in sched.requests.items():
        if req.is_finished():
            continue
        n = counts.get(rid, 0)
        st = hook_states.get(rid)
        if st is not None and st.parked:
            if n:
                problems.append(f"{rid} is parked and in {n} scheduler queues")
        elif n != 1:
            problems.append(f"{rid} ({req.status.name}) is in {n} scheduler queues")
        prompt = req.prompt_token_ids or []
        if list(req.all_token_ids[: len(prompt)]) != list(prompt) or (
            req.num_prompt_tokens != len(prompt)
        ):
            problems.append(
                f"{rid}: all_token_ids ({req.num_tokens}) does not start with its "
                f"prompt ({len(prompt)} tokens, num_prompt_tokens="
                f"{req.num_prompt_tokens})"
            )
        drafts = 0
        if scheduler_output is not None:
            drafts = len(scheduler_output.scheduled_spec_decode_tokens.get(rid, ()))
        if req.num_computed_tokens > req.num_tokens + req.num_output_placeholders + drafts:
            problems.append(
                f"{rid}: num_computed_tokens {req.num_computed_tokens} > "
                f"num_tokens {req.num_tokens} + placeholders "
                f"{req.num_output_placeholders} + drafts {drafts}"
            )
    for rid in counts:
        if rid not in sched.requests:
            problems.append(f"{rid} is queued but not in scheduler.requests")
    parked = sum(
        1 for r in sched.requests.values()
        if r.status == RequestStatus.WAITING_FOR_STREAMING_REQ
    )
    if parked != sched.num_waiting_for_streaming_input:
        problems.append(
            f"num_waiting_for_streaming_input={sched.num_waiting_for_streaming_input}"
            f" but {parked} requests are WAITING_FOR_STREAMING_REQ"
        )
    if fork_join is not None and hasattr(sched, "hooks"):
        from vllm_seqhooks.engine.lifecycle import lifecycle_problems

        problems += lifecycle_problems(sched.fork_join)
        problems += sched.fork_join.quiet_problems()
        if sched._plain and not sched.plain_now():
            problems.append("steps are vLLM's own (_plain) with fork/join work pending")
        bound = [name for name in sched.PLAIN_BOUND if name in vars(sched)]
        if bound != (list(sched.PLAIN_BOUND) if sched._plain else []):
            problems.append(f"plain step methods {bound} bound with _plain={sched._plain}")
        if sched._plain and sched._plain_watched is not sched.fork_join.watched_ids:
            problems.append("the bound update_from_output looks for other ids than watched_ids")
    if problems:
        raise InvariantError("; ".join(problems))


class SchedHarness:
    """EngineCore + worker stand-in around one scheduler.

    ``scripts[request_id]`` is the list of tokens a request samples, in
    order (children included, by their ``<parent>@seqhooks-child<i>`` id);
    past its end the request samples :func:`filler` tokens.
    """

    def __init__(
        self,
        async_scheduling: bool,
        *,
        scheduler=None,
        scripts: dict[str, Sequence[int]] | None = None,
        check: bool = True,
        num_spec_tokens: int | None = None,
        acceptance: Callable[[str, int, int], int] | None = None,
        **scheduler_kwargs: Any,
    ) -> None:
        if num_spec_tokens is None:
            num_spec_tokens = int(os.environ.get("SEQHOOKS_HARNESS_SPEC_TOKENS", "0"))
        self.async_scheduling = async_scheduling
        self.num_spec_tokens = num_spec_tokens
        #: fn(request_id, index of the first token sampled, drafts) -> how
        #: many drafts the "model" accepts (default: all).
        self.acceptance = acceptance or (lambda rid, index, drafts: drafts)
        self.sched = scheduler or make_scheduler(
            async_scheduling, num_spec_tokens=num_spec_tokens, **scheduler_kwargs
        )
        self.block_size = self.sched.block_size
        self.scripts: dict[str, list[int]] = {
            k: list(v) for k, v in (scripts or {}).items()
        }
        #: Run :func:`check_invariants` after every schedule and update.
        self.check = check
        self.batch_queue: deque = deque()
        self.batch_queue_size = 2 if async_scheduling else 1
        self.num_steps = 0
        #: One entry per schedule() call: request id -> tokens scheduled.
        self.schedules: list[dict[str, int]] = []
        #: One entry per schedule() call: request id -> num_computed_tokens
        #: *before* that schedule (for scheduled requests).
        self.computed_before: list[dict[str, int]] = []
        #: One entry per update_from_output: the EngineCoreOutput list.
        self.output_log: list[list[Any]] = []
        self.tokens: dict[str, list[int]] = {}
        self.finish_reasons: dict[str, Any] = {}
        self.final_outputs: dict[str, Any] = {}
        #: request id -> client indexes its outputs were addressed to.
        self.output_clients: dict[str, set[int]] = {}
        #: Union of EngineCoreOutputs.finished_requests (include_finished_set).
        self.finished_sets: set[str] = set()
        #: Ids of requests vLLM preempted (from SchedulerOutput.preempted_req_ids).
        self.preempted: set[str] = set()
        #: request ids seen in outputs after they had finished (a bug).
        self.outputs_after_finish: list[tuple[str, Any]] = []
        #: Aborts to apply inside the next step, after schedule() and before
        #: update_from_output (EngineCore._process_aborts_queue).
        self.pending_aborts: list[str] = []
        #: Callbacks run after each schedule(): fn(harness, scheduler_output).
        self.after_schedule: list[Callable[[SchedHarness, Any], None]] = []
        #: Callbacks run after each update_from_output: fn(harness, outputs).
        self.after_update: list[Callable[[SchedHarness, list[Any]], None]] = []

    # ------------------------------------------------------------ requests
    def add(
        self,
        request_id: str,
        prompt: Sequence[int],
        *,
        script: Sequence[int] | None = None,
        max_tokens: int = 16,
        **kwargs: Any,
    ):
        if script is not None:
            self.scripts[request_id] = list(script)
        req = make_request(
            request_id, prompt, block_size=self.block_size, max_tokens=max_tokens, **kwargs
        )
        self.sched.add_request(req)
        return req

    def abort(self, request_ids: Iterable[str] | str, scheduler_output=None):
        """``EngineCore.abort_requests``: finish_requests(..., ABORTED)
        (``scheduler_output``: the step in flight, if any)."""
        from vllm.v1.request import RequestStatus

        if isinstance(request_ids, str):
            request_ids = [request_ids]
        finished = self.sched.finish_requests(
            list(request_ids), RequestStatus.FINISHED_ABORTED
        )
        if self.check:
            check_invariants(self.sched, scheduler_output)
        return finished

    # -------------------------------------------------------------- worker
    def token_for(self, request_id: str, index: int) -> int:
        script = self.scripts.get(request_id)
        if script is not None and 0 <= index < len(script):
            return script[index]
        return filler(request_id, index)

    def execute(self, scheduler_output):
        """The worker: for every request that finished its prefill in this
        step (none for a non-final prefill chunk), one sampled token, or,
        with drafts scheduled, the accepted drafts plus one."""
        from vllm.v1.outputs import ModelRunnerOutput

        req_ids = list(scheduler_output.num_scheduled_tokens)
        spec = scheduler_output.scheduled_spec_decode_tokens
        sampled: list[list[int]] = []
        for rid in req_ids:
            req = self.sched.requests[rid]
            if req.is_prefill_chunk:
                sampled.append([])
                continue
            index, readded = self._next_index(scheduler_output, rid)
            drafts = spec.get(rid, ())
            if not self.async_scheduling:
                # vLLM pads a resumed decode with -1 drafts: never accepted.
                drafts = drafts[: drafts.index(-1)] if -1 in drafts else drafts
            elif readded:
                # Under async scheduling every draft is a -1 placeholder the
                # worker fills in; it has none for a request it just got.
                drafts = ()
            accepted = min(len(drafts), self.acceptance(rid, index, len(drafts)))
            sampled.append([self.token_for(rid, index + i) for i in range(accepted + 1)])
        return ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=sampled,
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=[],
        )

    def _next_index(self, scheduler_output, rid: str) -> tuple[int, bool]:
        """Script index of the next token ``rid`` samples (the scripted
        logits processor's ``k``), and whether the worker (re)gets the
        request in this step."""
        req = self.sched.requests[rid]
        extra = req.sampling_params.extra_args or {}
        before = int(extra.get(SAMPLED_BEFORE_ARG, 0))
        cached = scheduler_output.scheduled_cached_reqs
        readded = rid in cached.resumed_req_ids or any(
            r.req_id == rid for r in scheduler_output.scheduled_new_reqs
        )
        if not self.num_spec_tokens:
            return before + req.num_computed_tokens - req.num_prompt_tokens, readded
        # The scheduler's count of computed tokens assumes every draft in
        # flight is accepted; the worker knows what it sampled.
        index = before + req.num_tokens - req.num_prompt_tokens
        if not readded:
            for out, mro in self.batch_queue:
                i = mro.req_id_to_index.get(rid)
                if i is not None:
                    index += len(mro.sampled_token_ids[i])
        return index, readded

    def propose_drafts(self, scheduler_output) -> None:
        """``EngineCore.post_step`` under sync scheduling: the next
        ``num_spec_tokens`` script tokens of each request of the step."""
        from vllm.v1.outputs import DraftTokenIds

        req_ids, drafts = [], []
        for rid in scheduler_output.num_scheduled_tokens:
            req = self.sched.requests.get(rid)
            if req is None or req.is_finished():
                continue
            extra = req.sampling_params.extra_args or {}
            index = int(extra.get(SAMPLED_BEFORE_ARG, 0)) + req.num_tokens - req.num_prompt_tokens
            req_ids.append(rid)
            drafts.append([self.token_for(rid, index + i) for i in range(self.num_spec_tokens)])
        self.sched.update_draft_token_ids(DraftTokenIds(req_ids, drafts))

    # -------------------------------------------------------------- engine
    def has_work(self) -> bool:
        return self.sched.has_requests() or bool(self.batch_queue)

    def _schedule(self):
        before = {
            rid: req.num_computed_tokens for rid, req in self.sched.requests.items()
        }
        out = self.sched.schedule()
        self.schedules.append(dict(out.num_scheduled_tokens))
        self.preempted.update(out.preempted_req_ids or ())
        self.computed_before.append(
            {rid: before.get(rid, 0) for rid in out.num_scheduled_tokens}
        )
        if self.check:
            check_invariants(self.sched, out)
        for cb in self.after_schedule:
            cb(self, out)
        return out

    def _update(self, scheduler_output, model_runner_output) -> list[Any]:
        if self.pending_aborts:
            ids, self.pending_aborts = self.pending_aborts, []
            self.abort(ids, scheduler_output)
        outs = self.sched.update_from_output(scheduler_output, model_runner_output)
        flat: list[Any] = []
        for client_index, eco in outs.items():
            flat.extend(eco.outputs)
            if eco.finished_requests:
                self.finished_sets |= set(eco.finished_requests)
            for o in eco.outputs:
                self.output_clients.setdefault(o.request_id, set()).add(client_index)
        for o in flat:
            rid = o.request_id
            if rid in self.finish_reasons:
                self.outputs_after_finish.append((rid, o))
            self.tokens.setdefault(rid, []).extend(o.new_token_ids)
            if o.finish_reason is not None:
                self.finish_reasons[rid] = o.finish_reason
                self.final_outputs[rid] = o
        self.output_log.append(flat)
        if self.check:
            check_invariants(self.sched)
        for cb in self.after_update:
            cb(self, flat)
        return flat

    def step(self) -> list[Any] | None:
        """One EngineCore step; returns the outputs processed (None when the
        step only scheduled, as ``step_with_batch_queue`` does)."""
        self.num_steps += 1
        if not self.async_scheduling:
            if not self.sched.has_requests():
                return None
            out = self._schedule()
            mro = self.execute(out)
            outputs = self._update(out, mro)
            if self.num_spec_tokens and out.total_num_scheduled_tokens > 0:
                self.propose_drafts(out)
            return outputs
        # EngineCore.step_with_batch_queue with a queue of 2.
        queue = self.batch_queue
        if self.sched.has_requests():
            out = self._schedule()
            mro = self.execute(out)
            model_executed = out.total_num_scheduled_tokens > 0
            queue.appendleft((out, mro))
            if len(queue) < self.batch_queue_size and (
                model_executed or self.sched.has_requests()
            ):
                return None
        elif not queue:
            return None
        out, mro = queue.pop()
        return self._update(out, mro)

    def run(self, max_steps: int = 200, until: Callable[[], bool] | None = None) -> int:
        """Step until the engine has no work (or ``until()`` holds); raise
        StallError past ``max_steps``. Returns the number of steps taken."""
        n = 0
        while self.has_work():
            if until is not None and until():
                return n
            if n >= max_steps:
                raise StallError(
                    f"no progress after {max_steps} steps: "
                    f"{len(self.sched.requests)} requests left, "
                    f"running={[r.request_id for r in self.sched.running]}, "
                    f"waiting={[(r.request_id, r.status.name) for r in self.sched.waiting]}, "
                    f"kv_holding={[(r.request_id, r.status.name) for r in self.sched.kv_holding_waiting]}"
                )
            self.step()
            n += 1
        return n

    def run_until(self, cond: Callable[[], bool], max_steps: int = 100) -> int:
        n = 0
        while not cond():
            if n >= max_steps:
                raise StallError(f"condition not reached within {max_steps} steps")
            if not self.has_work():
                raise StallError("engine idle before the condition was reached")
            self.step()
            n += 1
        return n

    def drain(self) -> None:
        """Process what is left in the batch queue (async), without
        scheduling more."""
        while self.batch_queue:
            out, mro = self.batch_queue.pop()
            self._update(out, mro)

    # ------------------------------------------------------------- queries
    def trace(self, request_id: str) -> dict | None:
        out = self.final_outputs.get(request_id)
        if out is None:
            return None
        params = out.kv_transfer_params or {}
        return params.get(TRACE_KEY)

    def outputs_for(self, request_id: str) -> list[Any]:
        return [o for step in self.output_log for o in step if o.request_id == request_id]

    def all_output_ids(self) -> set[str]:
        return {o.request_id for step in self.output_log for o in step}

    def scheduled_counts(self, request_id: str) -> list[int]:
        return [s[request_id] for s in self.schedules if request_id in s]

    def free_blocks(self) -> int:
        return self.sched.kv_cache_manager.block_pool.get_num_free_blocks()

    def blocks_of(self, request_id: str) -> list[int]:
        blocks = self.sched.kv_cache_manager.get_blocks(request_id)
        return [b for group in blocks.get_block_ids() for b in group]
