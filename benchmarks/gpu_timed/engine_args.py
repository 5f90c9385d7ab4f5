"""The engine arguments that make an engine GPU-timed (``LLM`` keyword
arguments; :mod:`.serve` turns them into ``vllm serve`` flags)."""

from __future__ import annotations

from typing import Any

from benchmarks.gpu_timed.profiles import parse_profile

WORKER_CLS = "benchmarks.gpu_timed.worker.GpuTimedWorker"


def gpu_timed_engine_args(profile: str, *, filler_token: int,
                          stats_path: str | None = None) -> dict[str, Any]:
    gpu, model = parse_profile(profile)
    config: dict[str, Any] = {"gpu": gpu, "model": model, "filler_token": filler_token}
    if stats_path is not None:
        config["stats_path"] = str(stats_path)
    return {"worker_cls": WORKER_CLS, "additional_config": {"gpu_timed": config}}
