"""Drive a V1 scheduler directly, without a model or a worker ("surgical"
scheduler tests, in the style of vLLM's own ``tests/v1/core`` tests).

The harness builds a :class:`~vllm.config.VllmConfig` offline (a tiny Llama
``config.json`` written to a temporary directory, no tokenizer, no weights), a
one-group full-attention :class:`~vllm.v1.kv_cache_interface.KVCacheConfig`
and the scheduler, then plays the part of EngineCore and of the worker:

* :class:`SchedHarness` ``.step()`` is one ``EngineCore.step`` (sync
  scheduling) or one ``EngineCore.step_with_batch_queue`` with a batch queue of
  two (async scheduling): step N+1 is scheduled *before* the output of step N
  is processed, so the async scheduler's output placeholders are exercised;
* the "worker" (:meth:`SchedHarness.execute`) samples, for every scheduled
  request that is not a non-final prefill chunk, the token its *script* gives
  for the position being sampled.  The index into the script is the one the
  scripted-token logits processor (``vllm_seqhooks.testing.scripted``) uses:
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

Token ids are those of ``vllm_seqhooks.testing.tiny_model`` (EOS 2,
``<promise>`` 4, ``</promise>`` 5, ``<sync>`` 6, ``"\\n"`` 8 as the merge
separator).  Importing this module imports vLLM.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import deque
from typing import Any, Callable, Iterable, Sequence

from vllm_seqhooks.config import SpecialKwargs
from vllm_seqhooks.dependencies import SAMPLED_BEFORE_ARG
from vllm_seqhooks.testing.tiny_model import (
    EOS_ID,
    PROMISE_END_ID,
    PROMISE_ID,
    SYNC_ID,
)

#: Merge separator used by default (the tiny tokenizer's "\n").
SEP_ID = 8
#: Marker tokens used as ``failed_child_marker_token_ids`` in tests.
FAILED_MARKER_IDS = (90, 91)
#: Vocabulary of the fake model (the tiny model's padded vocab).
VOCAB = 128
#: Tokens the "model" produces when a script is exhausted: never a hook
#: token, EOS or the separator.
FILLER_BASE = 20
FILLER_SPAN = 60

TRACE_KEY = "seqhooks"

_MODEL_DIR: str | None = None
_HASH_READY = False


def tiny_model_dir() -> str:
    """A directory holding only a tiny Llama ``config.json`` (per process)."""
    global _MODEL_DIR
    if _MODEL_DIR is None or not os.path.isdir(_MODEL_DIR):
        d = tempfile.mkdtemp(prefix="seqhooks_sched_harness_")
        cfg = {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "vocab_size": VOCAB,
            "max_position_embeddings": 4096,
            "bos_token_id": 1,
            "eos_token_id": EOS_ID,
            "rms_norm_eps": 1e-5,
            "torch_dtype": "float32",
            "tie_word_embeddings": False,
        }
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        _MODEL_DIR = d
    return _MODEL_DIR


def default_hooks(**overrides: Any) -> SpecialKwargs:
    """Resolved hook settings (no tokenizer needed): the tiny model's ids."""
    base: dict[str, Any] = dict(
        sync_token_id=SYNC_ID,
        promise_token_id=PROMISE_ID,
        promise_end_token_id=PROMISE_END_ID,
        merge_separator_token_ids=[SEP_ID],
    )
    base.update(overrides)
    if base.get("failed_child_marker") is not None and base.get(
        "failed_child_marker_token_ids"
    ) is None:
        base["failed_child_marker_token_ids"] = list(FAILED_MARKER_IDS)
    return SpecialKwargs(**base)


def make_vllm_config(
    async_scheduling: bool,
    *,
    num_blocks: int = 64,
    block_size: int = 16,
    max_num_seqs: int = 16,
    max_model_len: int = 512,
    max_num_batched_tokens: int | None = None,
    enable_prefix_caching: bool = True,
    hooks: SpecialKwargs | dict | None = None,
    policy: str = "fcfs",
    num_spec_tokens: int = 0,
):
    """A VllmConfig built offline; ``hooks`` None means no seqhooks config;
    ``num_spec_tokens`` > 0 configures ngram speculative decoding."""
    from vllm.config import (
        CacheConfig,
        ModelConfig,
        ParallelConfig,
        SchedulerConfig,
        SpeculativeConfig,
        VllmConfig,
    )

    if max_num_batched_tokens is None:
        max_num_batched_tokens = max(max_model_len, 256)
    model_config = ModelConfig(
        model=tiny_model_dir(),
        skip_tokenizer_init=True,
        max_model_len=max_model_len,
        dtype="float32",
        seed=0,
    )
    scheduler_config = SchedulerConfig(
        max_model_len=max_model_len,
        is_encoder_decoder=False,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        enable_chunked_prefill=True,
        async_scheduling=async_scheduling,
        policy=policy,
    )
    cache_config = CacheConfig(
        block_size=block_size, enable_prefix_caching=enable_prefix_caching
    )
    additional: dict[str, Any] = {}
    if hooks is not None:
        if isinstance(hooks, dict):
            hooks = default_hooks(**hooks)
        additional = hooks.to_additional_config()
    speculative_config = None
    if num_spec_tokens:
        speculative_config = SpeculativeConfig(
            # vLLM allows async scheduling with the GPU n-gram proposer only.
            method="ngram_gpu" if async_scheduling else "ngram",
            num_speculative_tokens=num_spec_tokens,
            prompt_lookup_max=num_spec_tokens,
            prompt_lookup_min=1,
            target_model_config=model_config,
            target_parallel_config=ParallelConfig(),
        )
    vllm_config = VllmConfig(
        model_config=model_config,
        scheduler_config=scheduler_config,
        cache_config=cache_config,
        speculative_config=speculative_config,
        additional_config=additional,
    )
    # The CPU platform turns async scheduling off; the scheduler itself does
    # not care which platform it runs on.
    vllm_config.scheduler_config.async_scheduling = async_scheduling
    vllm_config.cache_config.num_gpu_blocks = num_blocks
    return vllm_config


def make_kv_cache_config(num_blocks: int, block_size: int):
    import torch
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
    )

    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer"],
                FullAttentionSpec(
                    block_size=block_size,
                    num_kv_heads=1,
                    head_size=16,
                    dtype=torch.float32,
                ),
            )
        ],
    )


def block_hasher(block_size: int):
    global _HASH_READY
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    if not _HASH_READY:
        init_none_hash(sha256)
        _HASH_READY = True
    return get_request_block_hasher(block_size, sha256)


def make_scheduler(
    async_scheduling: bool,
    *,
    num_blocks: int = 64,
    block_size: int = 16,
    max_num_seqs: int = 16,
    max_model_len: int = 512,
    max_num_batched_tokens: int | None = None,
    enable_prefix_caching: bool = True,
    hooks: dict | SpecialKwargs | None = None,
    stock: bool = False,
    log_stats: bool = False,
    policy: str = "fcfs",
    include_finished_set: bool = False,
    num_spec_tokens: int = 0,
):
    """Build ``SeqHooksScheduler`` (or, with ``stock=True``, vLLM's own
    ``Scheduler`` / ``AsyncScheduler`` on the same config).

    ``hooks``: a dict of :class:`SpecialKwargs` overrides on top of
    :func:`default_hooks`, or a SpecialKwargs."""
    from vllm.v1.structured_output import StructuredOutputManager

    if stock:
        spec = None
    elif isinstance(hooks, SpecialKwargs):
        spec = hooks
    else:
        spec = default_hooks(**(hooks or {}))
    vllm_config = make_vllm_config(
        async_scheduling,
        num_blocks=num_blocks,
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        max_num_batched_tokens=max_num_batched_tokens,
        enable_prefix_caching=enable_prefix_caching,
        hooks=spec,
        policy=policy,
        num_spec_tokens=num_spec_tokens,
    )
    kv_cache_config = make_kv_cache_config(num_blocks, block_size)
    kwargs = dict(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=block_size,
        log_stats=log_stats,
        include_finished_set=include_finished_set,
    )
    if stock:
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler

        cls = AsyncScheduler if async_scheduling else Scheduler
        return cls(**kwargs)
    from vllm_seqhooks.scheduler import SeqHooksScheduler

    return SeqHooksScheduler(**kwargs)


def make_request(
    request_id: str,
    prompt_token_ids: Sequence[int],
    *,
    block_size: int,
    max_tokens: int = 16,
    min_tokens: int = 0,
    extra_args: dict | None = None,
    seed: int | None = None,
    stop_token_ids: list[int] | None = None,
    client_index: int = 0,
    arrival_time: float | None = None,
    resumable: bool = False,
    priority: int = 0,
):
    from vllm import SamplingParams
    from vllm.v1.request import Request

    sp = SamplingParams(
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        temperature=0.0,
        seed=seed,
        extra_args=extra_args,
        stop_token_ids=stop_token_ids,
    )
    # What the frontend does with the model's generation config.
    sp.update_from_generation_config({}, eos_token_id=EOS_ID)
    return Request(
        request_id=request_id,
        prompt_token_ids=list(prompt_token_ids),
        sampling_params=sp,
        pooling_params=None,
        client_index=client_index,
        arrival_time=arrival_time,
        block_hasher=block_hasher(block_size),
        resumable=resumable,
        priority=priority,
    )


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
      ``kv_holding_waiting`` (parked ones included);
    * ``num_waiting_for_streaming_input`` equals the number of requests with
      status ``WAITING_FOR_STREAMING_REQ``;
    * a request's token list starts with its prompt, and it never has more
      computed tokens than tokens (+ output placeholders, + the draft tokens
      ``scheduler_output`` scheduled for it, when given).
    """
    from vllm.v1.request import RequestStatus

    counts: dict[str, int] = {}
    for queue in (sched.running, sched.waiting, sched.kv_holding_waiting):
        for req in queue:
            counts[req.request_id] = counts.get(req.request_id, 0) + 1
    problems = []
    for rid, req in sched.requests.items():
        if req.is_finished():
            continue
        n = counts.get(rid, 0)
        if n != 1:
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
