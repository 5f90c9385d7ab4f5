"""The worker interface a worker of our own implements (``worker_cls``):
the GPU-timed worker of ``benchmarks.gpu_timed`` subclasses the CPU
platform's worker and answers ``execute_model`` / ``sample_tokens`` itself.

What it relies on: the CPU worker class and its two step methods, the
fields of the scheduler output it reads, the model-runner output it
builds (plain or asynchronous, as the GPU runner returns with async
scheduling), and the shared-memory queue's reader spin it turns into naps
in its own process (:func:`queue_readers_nap`).
:func:`worker_api_problems` checks them.
"""

from __future__ import annotations

import dataclasses
import inspect
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


SPIN_CONDITION_WAIT = ("wait", ("self", "timeout_ms"))
SPIN_CONDITION_FIELDS = ("last_read", "busy_loop_s")
#: How long a napping queue reader sleeps between two looks at the queue.
READER_NAP_S = 100e-6


def queue_readers_nap() -> None:
    """Shared-memory queue readers in this process nap ``READER_NAP_S``
    between two looks at an empty queue in the second after their last read,
    where vLLM's ``SpinCondition.wait`` only yields the CPU (it still does
    what it does, then the nap); after that second they wait for the
    writer's notification, as vLLM's do. For a worker whose process shares a
    CPU with the engine core: on a GPU host each spins on its own core; here
    the worker's spinning took that core from the engine core and from the
    worker's own output thread. (Waiting for the notification only, with
    ``busy_loop_s=0``, lost some on vLLM 0.32: a step then waited the
    reader's 5 s recheck.)"""
    import time

    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

    wait = SpinCondition.wait
    if getattr(wait, "_seqhooks_nap", False):
        return

    def napping_wait(self, timeout_ms=None):
        busy = time.monotonic() <= self.last_read + self.busy_loop_s
        wait(self, timeout_ms)
        if busy:
            time.sleep(READER_NAP_S)

    napping_wait._seqhooks_nap = True
    SpinCondition.wait = napping_wait


def worker_api_problems() -> list[str]:
    from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
    from vllm.v1.outputs import AsyncModelRunnerOutput, ModelRunnerOutput

    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

    found = method_problems(cpu_worker_class(), WORKER_METHODS)
    found += method_problems(SpinCondition, (SPIN_CONDITION_WAIT,))
    init = inspect.getsource(SpinCondition.__init__)
    found += [f"SpinCondition.__init__ no longer sets {name}"
              for name in SPIN_CONDITION_FIELDS if f"self.{name} =" not in init]
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
