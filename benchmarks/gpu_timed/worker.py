"""A vLLM worker whose steps take a GPU's time: ``worker_cls`` of the
GPU-timed engine.

It is the CPU platform's worker (device, KV cache, memory: real, sized by
the tiny model the engine loads) with the two step methods answered here:
no forward pass runs. ``execute_model`` follows the scheduler output
(:class:`.tracker.RequestTracker`), prices the step
(:class:`.step_model.StepModel`) and queues it on a modelled GPU that runs
one step at a time; ``sample_tokens`` returns the step's output, which
becomes available when the modelled GPU finishes the step (a sleep, not
compute). With async scheduling vLLM's worker process waits for it on its
output thread while the engine core schedules the next step, as on a GPU
host; without, the worker waits in line.

Configured through ``additional_config={"gpu_timed": {...}}`` (``gpu``,
``model``, ``filler_token``, ``stats_path``, ``traces``:
:func:`.engine_args.gpu_timed_engine_args` writes them). With ``traces``
(``mode``, ``scale``, ``prompt_tokens``), a request without a script samples
the family its prompt picks (:class:`.trace_book.TraceBook`): how plain
prompts from ``vllm bench serve`` become ThreadWeaver-format families.
The worker's process naps between its looks at the engine core's queue
where vLLM's reader spins (:func:`queue_readers_nap`): on a GPU host it
spins on a core of its own; here it shares the engines' half of the CPUs
with the engine core (:mod:`.host_split`), and its spinning delayed the
engine core and its own output thread (one family on 1.5B, 2026-12-04: the
family's latency 10 % above the modelled GPU's busy time, about 0.3 ms a
step).
``set_time_scale`` (vLLM's ``collective_rpc``) stretches the wait of every
later step (:mod:`.time_scale`); ``set_profile`` prices them for another
GPU and model; ``take_request_spans`` gives how long each
request took on the modelled GPU (:mod:`.request_spans`). The worker writes
its counters (steps, request-steps, modelled GPU seconds; and whether async
scheduling is on) as JSON to ``stats_path`` from a thread, within a fraction
of a second of each change, and at shutdown.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

from vllm_seqhooks.engine.vllm_private.worker_api import (
    async_output,
    cpu_worker_class,
    empty_output,
    model_runner_output,
    queue_readers_nap,
)
from vllm_seqhooks.scripted.params import encode_script
from vllm_seqhooks.scripted.protocol import forcing_plan, model_eos_token_id, resolve_script

from benchmarks.gpu_timed.profiles import parse_profile, step_model_for
from benchmarks.gpu_timed.request_spans import RequestSpans
from benchmarks.gpu_timed.stats_file import keep_stats_written, write_stats
from benchmarks.gpu_timed.trace_book import TraceBook
from benchmarks.gpu_timed.tracker import RequestTracker

CONFIG_KEY = "gpu_timed"


class ModelledGpu:
    """A device that runs one step at a time: a step starts when it is
    queued and the previous one is done, and lasts its modelled time times
    ``time_scale`` (:mod:`.time_scale`: at 4, the host has four times the
    wall time for each step, as a host four times as fast would have at 1);
    ``busy_s`` counts modelled seconds."""

    def __init__(self, clock=time.monotonic) -> None:
        self._clock = clock
        self.free_at = 0.0
        self.last_start = 0.0
        self.steps = 0
        self.request_steps = 0
        self.busy_s = 0.0
        self.time_scale = 1.0

    def queue(self, seconds: float, requests: int) -> float:
        """Queue a step; returns the clock time it finishes."""
        start = self.last_start = max(self._clock(), self.free_at)
        self.free_at = start + seconds * self.time_scale
        self.steps += 1
        self.request_steps += requests
        self.busy_s += seconds
        return self.free_at

    def counters(self) -> dict[str, float]:
        return {"steps": self.steps, "request_steps": self.request_steps,
                "modelled_gpu_s": self.busy_s}


def _trace_book(cfg, vllm_config, eos: int) -> TraceBook | None:
    if not cfg:
        return None
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(vllm_config.model_config.tokenizer)
    return TraceBook(cfg["mode"], float(cfg["scale"]), int(cfg["prompt_tokens"]), eos,
                     lambda text: encode_script(tokenizer, text))


def _sleep_until(deadline: float) -> None:
    left = deadline - time.monotonic()
    if left > 0:
        time.sleep(left)


class GpuTimedWorker(cpu_worker_class()):
    def __init__(self, vllm_config, *args, **kwargs) -> None:
        super().__init__(vllm_config, *args, **kwargs)
        queue_readers_nap()
        cfg = (vllm_config.additional_config or {}).get(CONFIG_KEY) or {}
        self._filler = int(cfg["filler_token"])
        self._stats_path = cfg.get("stats_path")
        self._model = step_model_for(cfg["gpu"], cfg["model"])
        self._eos = model_eos_token_id(vllm_config)
        self._book = _trace_book(cfg.get("traces"), vllm_config, self._eos)
        self._tracker = RequestTracker(self._plan_for, self._filler)
        self._gpu = ModelledGpu()
        self._spans = RequestSpans()
        self._async = bool(vllm_config.scheduler_config.async_scheduling)
        self._pending = None
        if self._stats_path is not None:
            keep_stats_written(self._stats_path, self._counters, "gpu-timed-stats")

    def _plan_for(self, new):
        params = new.sampling_params
        if params is None:
            return None
        if self._book is not None and resolve_script(params.extra_args) is None:
            params = SimpleNamespace(
                extra_args=self._book.extra_args(new.prompt_token_ids, params.extra_args),
                eos_token_id=params.eos_token_id)
        return forcing_plan(params, self._eos)

    def execute_model(self, scheduler_output):
        if scheduler_output.scheduled_spec_decode_tokens:
            raise ValueError("the GPU-timed worker does not model speculative decoding")
        step = self._tracker.step(scheduler_output)
        if scheduler_output.total_num_scheduled_tokens == 0:
            return empty_output()
        done_at = self._gpu.queue(self._model.seconds(step.batch), len(step.batch))
        self._spans.step(step.req_ids, self._gpu.last_start, done_at)
        self._pending = (step, done_at)
        return None

    def sample_tokens(self, grammar_output):
        step, done_at = self._pending
        self._pending = None
        output = model_runner_output(step.req_ids, step.sampled)

        def when_done():
            _sleep_until(done_at)
            return output

        return async_output(when_done)

    def set_time_scale(self, scale: float | str) -> float:
        """Each later step waits ``scale`` times its modelled time (called
        between runs, through vLLM's ``collective_rpc``; over HTTP its
        arguments may come as strings)."""
        scale = float(scale)
        if not scale >= 1:
            raise ValueError(f"time scale {scale!r}: at least 1 (a host no slower than this one)")
        self._gpu.time_scale = scale
        return scale

    def set_profile(self, profile: str) -> str:
        """Each later step takes ``profile``'s time (``<gpu>/<model>``;
        between runs, through ``collective_rpc``): one engine serves the
        grid's profiles one after another."""
        self._model = step_model_for(*parse_profile(profile))
        return profile

    def take_request_spans(self) -> list[float]:
        """Each request's wall seconds from its first step's start to its
        last step's end, for the requests since the last call
        (:mod:`.request_spans`; through ``collective_rpc``)."""
        return self._spans.take()

    def _counters(self) -> dict:
        return {**self._gpu.counters(), "async_scheduling": self._async}

    def shutdown(self) -> None:
        if self._stats_path is not None:
            write_stats(self._stats_path, self._counters())
        super().shutdown()
