"""A real ``vllm serve`` of the tiny model on 127.0.0.1 for tests and
benchmarks: the flags; starting, stopping and scraping are the product's
(:mod:`vllm_seqhooks.local_server`), re-exported here."""

from __future__ import annotations

import os

from vllm_seqhooks.local_server import (  # noqa: F401 (re-exported)
    Server,
    free_port,
    metric,
    scrape,
    start_server,
    vllm_command,
)
from vllm_seqhooks.scripted.protocol import SCRIPTED_LOGITS_PROCESSOR_FQCN as SCRIPTED
from vllm_seqhooks.scripted.tiny_model import TINY_HOOK_FLAGS  # noqa: F401 (re-exported)

#: Engine flags for the tiny model on CPU.
TINY_FLAGS = ["--enforce-eager", "--dtype", "float32", "--max-model-len", "1024",
              "--block-size", "32", "--kv-cache-memory-bytes", str(64 << 20)]

#: The variable that keeps a server's model worker in its EngineCore process.
WORKER_IN_ENGINE_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def start_test_server(model: str, *flags: str, log_path: str | os.PathLike,
                      timeout: float = 300, env: dict[str, str] | None = None) -> Server:
    """:func:`start_server` with the model's worker in the EngineCore process
    (vLLM's ``UniProcExecutor``): two processes, the API server and its
    EngineCore, which is what vLLM runs for one GPU (``ParallelConfig``:
    world size 1 -> ``"uni"``). vLLM's CPU platform otherwise turns ``"uni"``
    into ``"mp"`` (``CpuPlatform.check_and_update_config``, unless this
    variable is ``0``): a third spawned process importing vLLM, about 13 s
    more to ``/health`` on 2 cores (19 s against 31-36 s, measured
    2026-12-02). For the tests of what a server answers; the tests of a
    deployment (the documented commands, the wheel's install check, Ray,
    ``test_serve_multi``) start vLLM's CPU default with :func:`start_server`.
    A variable ``env`` sets is kept."""
    env = dict(os.environ if env is None else env)
    for key, value in WORKER_IN_ENGINE_PROCESS.items():
        env.setdefault(key, value)
    return start_server(model, *flags, log_path=log_path, timeout=timeout, env=env)


#: The override of verl's trainer config (``local.trainer_config(overrides=)``)
#: that, with :data:`WORKER_IN_ENGINE_PROCESS` in the test process's
#: environment while the server starts, runs verl's server's worker in its
#: EngineCore process too: verl asks vLLM for the multiprocess executor
#: (``distributed_executor_backend: "mp"`` in ``vllm_async_server.py``,
#: before its ``engine_kwargs``, which win).
VERL_WORKER_IN_ENGINE_PROCESS = {
    "actor_rollout_ref.rollout.engine_kwargs.vllm.distributed_executor_backend": "uni"}
