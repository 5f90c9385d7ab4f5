"""What tests and benchmarks reach inside an in-process engine on the tiny
model; the scripted fork/join helpers themselves are the product's
(:mod:`vllm_seqhooks.scripted.llm`), re-exported here."""

from __future__ import annotations

from typing import Any

from vllm_seqhooks.scripted.llm import (  # noqa: F401 (re-exported)
    TINY_HOOKS,
    Scripts,
    hook_llm,
    scripted_engine_kwargs,
    scripted_processor_for,
)


def engine_core_of(llm: Any):
    """The in-process EngineCore of ``llm`` (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)."""
    core = llm.llm_engine.engine_core
    inner = getattr(core, "engine_core", None)
    if inner is None:
        raise RuntimeError("the engine runs in another process (multiprocessing on)")
    return inner


def worker_of(llm: Any):
    """The worker of an in-process engine with one worker."""
    return engine_core_of(llm).model_executor.driver_worker.worker


def model_runner_of(llm: Any):
    """The model runner of an in-process engine with one worker."""
    return worker_of(llm).model_runner


def fill_kv_cache_with_noise(llm: Any, seed: int = 0) -> int:
    """Overwrite every attention layer's KV cache of an in-process engine
    with finite noise (uniform in [-3, 3]); returns the number of layers.
    Before any request runs, a token whose attention reads a KV slot no
    request wrote (a position its context does not hold) then gets a
    visibly different logprob, where the zeros of a fresh cache, or the
    same stale values run after run, could hide it."""
    import torch

    layers = worker_of(llm).vllm_config.compilation_config.static_forward_context.values()
    caches = [layer.kv_cache for layer in layers if isinstance(getattr(layer, "kv_cache", None),
                                                              torch.Tensor)]
    if not caches:
        raise RuntimeError("no attention layer with a KV cache tensor in this engine")
    gen = torch.Generator().manual_seed(seed)
    for cache in caches:
        cache.copy_((torch.rand(cache.shape, generator=gen) * 6 - 3).to(cache.dtype))
    return len(caches)


def scheduler_of(llm: Any):
    return engine_core_of(llm).scheduler


def kv_blocks_in_use(llm: Any) -> int:
    """KV blocks held by requests (cached-but-free blocks are not in use)."""
    pool = scheduler_of(llm).kv_cache_manager.block_pool
    return pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()
