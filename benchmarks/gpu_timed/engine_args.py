"""The engine arguments that make an engine GPU-timed (``LLM`` keyword
arguments; :mod:`.serve` turns them into ``vllm serve`` flags), and the
size of the grid's engines (one source: :data:`ENGINE_SIZE`, as flags
:func:`serve_flags`)."""

from __future__ import annotations

from typing import Any

from benchmarks.gpu_timed.profiles import parse_profile
from benchmarks.gpu_timed.timed_scheduler import TIMED_SCHEDULER_PATH

WORKER_CLS = "benchmarks.gpu_timed.worker.GpuTimedWorker"

#: The size of every GPU-timed engine the grid starts (its two servers, its
#: in-process ``LLM``; also :mod:`.families`): the tiny model's 4096
#: positions, up to 1024 requests and 8192 tokens a step (256 families'
#: parallel threads at once), 32-token blocks, 1 GiB of KV cache.
ENGINE_SIZE: dict[str, Any] = dict(
    enforce_eager=True, dtype="float32", max_model_len=4096, max_num_seqs=1024,
    max_num_batched_tokens=8192, block_size=32, kv_cache_memory_bytes=1 << 30)


def serve_flags(kwargs: dict[str, Any]) -> list[str]:
    """``LLM`` keyword arguments as ``vllm serve`` flags (``True``: a bare flag)."""
    flags: list[str] = []
    for name, value in kwargs.items():
        flag = "--" + name.replace("_", "-")
        flags += [flag] if value is True else [flag, str(value)]
    return flags


def gpu_timed_engine_args(profile: str, *, filler_token: int, stats_path: str | None = None,
                          scheduler_stats_path: str | None = None,
                          hooks: bool = False,
                          traces: dict[str, Any] | None = None) -> dict[str, Any]:
    """``stats_path``: the worker's counters; ``scheduler_stats_path``: the
    scheduler's times (:mod:`.timed_scheduler`; for an engine with hooks,
    call :func:`.timed_scheduler.time_the_hook_scheduler` first); ``traces``:
    families picked by prompts (``mode``, ``scale``, ``prompt_tokens``:
    :class:`.trace_book.TraceBook`)."""
    gpu, model = parse_profile(profile)
    config: dict[str, Any] = {"gpu": gpu, "model": model, "filler_token": filler_token}
    if traces is not None:
        config["traces"] = dict(traces)
    if stats_path is not None:
        config["stats_path"] = str(stats_path)
    args: dict[str, Any] = {"worker_cls": WORKER_CLS}
    if scheduler_stats_path is not None:
        config["scheduler_stats_path"] = str(scheduler_stats_path)
        if hooks:
            from vllm_seqhooks.engine import SCHEDULER_CLASS_PATH

            config["scheduler_cls"] = SCHEDULER_CLASS_PATH
        else:
            args["scheduler_cls"] = TIMED_SCHEDULER_PATH
    args["additional_config"] = {"gpu_timed": config}
    return args
