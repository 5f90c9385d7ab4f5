"""The worker interface a worker of our own implements (``worker_cls``):
the GPU-timed worker of ``benchmarks.gpu_timed`` subclasses the CPU
platform's worker and answers ``execute_model`` / ``sample_tokens`` itself.

What it relies on: the CPU worker class and its two step methods, the
fields of the scheduler output it reads, and the model-runner output it
builds (plain or asynchronous, as the GPU runner returns with async
scheduling). :func:`worker_api_problems` checks them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from vllm_seqhooks.engine.vllm_private.common import method_problems

WORKER_METHODS = (
    ("execute_model", ("self", "scheduler_output")),
    ("sample_tokens", ("self", "grammar_output")),
)
NEW_REQUEST_FIELDS = ("req_id", "prompt_token_ids", "sampling_params", "num_computed_tokens")
CACHED_REQUEST_FIELDS = ("req_ids", "resumed_req_ids", "all_token_ids",
                         "num_computed_tokens", "num_output_tokens")
SCHEDULER_OUTPUT_FIELDS = ("scheduled_new_reqs", "scheduled_cached_reqs", "num_scheduled_tokens",
                           "total_num_scheduled_tokens", "finished_req_ids",
                           "scheduled_spec_decode_tokens")


def cpu_worker_class() -> type:
    from vllm.v1.worker.cpu_worker import CPUWorker

    return CPUWorker


def model_runner_output(req_ids: list[str], sampled: dict[str, int]):
    """The output of a step: one token for each request in ``sampled``,
    none for the others (a prefill chunk that has not reached its end)."""
    from vllm.v1.outputs import ModelRunnerOutput

    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
        sampled_token_ids=[[sampled[rid]] if rid in sampled else [] for rid in req_ids],
    )


def empty_output():
    from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT

    return EMPTY_MODEL_RUNNER_OUTPUT


def async_output(get: Callable[[], object]):
    """An ``AsyncModelRunnerOutput`` whose ``get_output`` calls ``get``
    (vLLM's worker process calls it on its output thread with async
    scheduling, at once without)."""
    from vllm.v1.outputs import AsyncModelRunnerOutput

    class _Deferred(AsyncModelRunnerOutput):
        def get_output(self):
            return get()

    return _Deferred()


def worker_api_problems() -> list[str]:
    from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
    from vllm.v1.outputs import AsyncModelRunnerOutput, ModelRunnerOutput

    found = method_problems(cpu_worker_class(), WORKER_METHODS)
    for cls, names in ((NewRequestData, NEW_REQUEST_FIELDS),
                       (CachedRequestData, CACHED_REQUEST_FIELDS),
                       (SchedulerOutput, SCHEDULER_OUTPUT_FIELDS)):
        have = {f.name for f in dataclasses.fields(cls)}
        found += [f"{cls.__name__}.{n} is missing" for n in names if n not in have]
    have = {f.name for f in dataclasses.fields(ModelRunnerOutput)}
    found += [f"ModelRunnerOutput.{n} is missing"
              for n in ("req_ids", "req_id_to_index", "sampled_token_ids") if n not in have]
    if "get_output" not in getattr(AsyncModelRunnerOutput, "__abstractmethods__", ()):
        found.append("AsyncModelRunnerOutput.get_output is no longer its abstract method")
    return found
