"""verl's rollout side in one process, without Ray: to try the agent loop on
a laptop or CPU, and what the tests and ``examples/verl_grpo_rollouts.py``
run (imports verl).

In training, verl starts each vLLM server as a Ray actor
(``vLLMReplica`` -> ``vLLMHttpServer``), routes requests through a
load-balancer actor, and runs agent loops in ``AgentLoopWorker`` actors.
Here the same classes run in this process:

- :func:`trainer_config`: verl's own full trainer config
  (``verl/trainer/config/_generated_ppo_trainer.yaml``) with the rollout
  settings a CPU needs and, given hook settings, :func:`~vllm_seqhooks.integrations.verl.engine_kwargs`
  under ``actor_rollout_ref.rollout.engine_kwargs.vllm``;
- :func:`start_server`: verl's ``vLLMHttpServer``, built and launched by its
  own code (its ``__init__`` asks Ray for the job id and the node address:
  answered here with this machine's loopback), which builds the ``vllm
  serve`` arguments from the config, starts vLLM's ``AsyncLLM`` with verl's
  worker extension and its HTTP server;
- :func:`server_client`: verl's ``LLMServerClient`` whose load balancer is a
  local object handing out that server;
- :func:`agent_loop_worker`: verl's ``AgentLoopWorker`` on that client:
  ``await worker.generate_sequences(batch)`` gives verl's ``DataProto``.

What stays Ray's: placement, several replicas, the trainer's weight sync
(``update_weights`` through the worker extension) and verl's hybrid
sleep/wake-up, which needs vLLM's sleep mode (not on CPU).
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator, Mapping, Optional

import ray
import ray.util
import verl
from omegaconf import DictConfig, OmegaConf

from vllm_seqhooks.integrations.verl import AGENT_LOOPS, AGENT_NAME, engine_kwargs

#: verl's generated full trainer config (every default, resolved by Hydra).
TRAINER_CONFIG = Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"

#: How long :func:`stop_server` waits for the engine's processes to exit
#: before vLLM kills them (the engine process waits for its worker's:
#: :mod:`vllm_seqhooks.engine.worker_exit`). vLLM's default, 5 s, is too
#: short on a busy machine: with another engine running on the same 2 cores
#: the worker took 5 s to exit and the EngineCore was still in its teardown
#: when the 5 s ran out ("force killing remaining process EngineCore", issue
#: 51 item 6). A quiet shutdown takes about a second; this only bounds a
#: slow one.
SHUTDOWN_TIMEOUT_S = 60.0


def trainer_config(model: str, special_kwargs: Any = None, *, prompt_length: int = 64,
                   response_length: int = 128, rollout_n: int = 1, temperature: float = 1.0,
                   calculate_log_probs: bool = True,
                   overrides: Optional[Mapping[str, Any]] = None) -> DictConfig:
    """verl's trainer config for a rollout of ``model`` on this machine's
    CPU: one replica, one worker, eager, the checkpoint's weights
    (``load_format: auto``; verl's default ``dummy`` waits for the trainer's),
    no sleep mode (vLLM's CPU platform has none), the agent loop
    :data:`AGENT_NAME` as default, and with ``special_kwargs`` the hook
    server's engine arguments. ``overrides``: dotted keys to set after."""
    cfg = OmegaConf.load(TRAINER_CONFIG)
    rollout = cfg.actor_rollout_ref.rollout
    cfg.actor_rollout_ref.model.path = str(model)
    cfg.trainer.n_gpus_per_node = 1
    cfg.data.max_prompt_length, cfg.data.max_response_length = prompt_length, response_length
    settings = {
        "name": "vllm", "load_format": "auto", "dtype": "float32", "enforce_eager": True,
        "enable_sleep_mode": False, "tensor_model_parallel_size": 1,
        "prompt_length": prompt_length, "response_length": response_length,
        "max_model_len": prompt_length + response_length,
        "max_num_batched_tokens": max(256, prompt_length + response_length),
        "n": rollout_n, "temperature": temperature, "calculate_log_probs": calculate_log_probs,
    }
    for key, value in settings.items():
        rollout[key] = value
    rollout.agent.default_agent_loop = AGENT_NAME
    rollout.agent.agent_loop_config_path = str(AGENT_LOOPS)
    if special_kwargs is not None:
        rollout.engine_kwargs.vllm = engine_kwargs(special_kwargs, model)
    for key, value in (overrides or {}).items():
        OmegaConf.update(cfg, key, value, force_add=True)
    return cfg


@contextlib.contextmanager
def _ray_answers_locally() -> Iterator[None]:
    """What ``vLLMHttpServer.__init__`` asks Ray (the job id, for a socket
    name; this node's address, for its HTTP server), answered without a
    Ray cluster."""
    saved = ray.get_runtime_context, ray.util.get_node_ip_address
    ray.get_runtime_context = lambda: SimpleNamespace(get_job_id=lambda: "local")
    ray.util.get_node_ip_address = lambda: "127.0.0.1"
    try:
        yield
    finally:
        ray.get_runtime_context, ray.util.get_node_ip_address = saved


async def start_server(config: DictConfig):
    """verl's ``vLLMHttpServer`` for ``config``'s rollout, launched (its
    engine running, its HTTP server on 127.0.0.1). Stop it with
    :func:`stop_server`. Its engine's worker gets
    :data:`~vllm_seqhooks.engine.worker_exit.WORKER_EXIT_S` to exit at
    shutdown unless ``VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS`` is set."""
    from verl.workers.rollout.replica import RolloutMode
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer

    from vllm_seqhooks.engine.worker_exit import worker_exit_grace

    with _ray_answers_locally():
        server = vLLMHttpServer(config.actor_rollout_ref.rollout, config.actor_rollout_ref.model,
                                RolloutMode.STANDALONE, workers=[], replica_rank=0, node_rank=0,
                                gpus_per_node=1, nnodes=1, cuda_visible_devices="")
    with worker_exit_grace():  # (the engine's processes start here)
        await server.launch_server()
    return server


async def stop_server(server: Any) -> None:
    """Stop a server :func:`start_server` started: its HTTP server (asked
    to exit, as at a signal), then its engine (processes included, waiting
    up to :data:`SHUTDOWN_TIMEOUT_S` for them to exit)."""
    task = getattr(server, "_server_task", None)
    if task is not None:
        uvicorn_server = _uvicorn_server_of(task)
        if uvicorn_server is not None:
            uvicorn_server.should_exit = True
        else:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    engine = server.engine
    engine.shutdown(timeout=SHUTDOWN_TIMEOUT_S)
    # AsyncLLM.__del__ shuts down again; verl's app state keeps the engine
    # until the interpreter's exit, where that second call fails on a
    # module already torn down (a TypeError printed at exit). Done is done.
    engine.shutdown = lambda *args, **kwargs: None


def _uvicorn_server_of(task: asyncio.Task) -> Any:
    """The ``uvicorn.Server`` whose ``serve()`` the task runs (verl keeps
    only the task), or None."""
    frame = getattr(task.get_coro(), "cr_frame", None)
    found = frame.f_locals.get("self") if frame is not None else None
    return found if hasattr(found, "should_exit") else None


class _Remote:
    """An object whose methods are called as Ray actor methods are
    (``handle.method.remote(...)``), in this process."""

    def __init__(self, target: Any) -> None:
        self._target = target

    def __getattr__(self, name: str) -> Any:
        return SimpleNamespace(remote=getattr(self._target, name))


class _OneServer:
    """verl's global load balancer's interface, for one server."""

    def __init__(self, server: Any) -> None:
        self.handle = _Remote(server)

    async def require_acquire_fields(self) -> list[str]:
        return []

    async def require_release_fields(self) -> list[str]:
        return []

    async def acquire_server(self, request_id: str, **_: Any):
        return "0", self.handle

    def release_server(self, server_id: str, **_: Any) -> None:
        return None


def server_client(config: DictConfig, server: Any):
    """verl's ``LLMServerClient`` (what agent loops call ``server_manager``)
    sending every request to ``server``."""
    from verl.workers.rollout.llm_server import LLMServerClient

    return LLMServerClient(config, load_balancer_handle=_Remote(_OneServer(server)))


def agent_loop_worker(config: DictConfig, client: Any):
    """verl's ``AgentLoopWorker`` on ``client`` (no reward workers: verl's
    batch then carries no scores; the caller scores)."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    return AgentLoopWorker(config, llm_client=client)


def prompts_batch(prompts: list[str], *, repeat: int = 1, global_step: int = 0):
    """verl's input ``DataProto`` for text prompts: one user message each
    (``raw_prompt``), each prompt ``repeat`` times in a row (a GRPO group:
    verl's trainer repeats the batch ``rollout.n`` times interleaved, as here),
    with ``index`` saying which prompt."""
    import numpy as np
    from verl.protocol import DataProto

    raw, index = [], []
    for i, text in enumerate(prompts):
        for _ in range(repeat):
            raw.append([{"role": "user", "content": text}])
            index.append(i)
    arrays = {"raw_prompt": np.empty(len(raw), dtype=object), "index": np.array(index)}
    arrays["raw_prompt"][:] = raw
    return DataProto.from_dict(non_tensors=arrays, meta_info={"global_steps": global_step})


def responses(batch: Any) -> list[list[int]]:
    """Each row's response token ids in verl's output ``DataProto``, without
    the padding (verl pads every response to ``response_length``; the
    response part of its attention mask says which are tokens)."""
    tokens = batch.batch["responses"]
    lengths = batch.batch["attention_mask"][:, -tokens.shape[1]:].sum(-1).tolist()
    return [tokens[i][:n].tolist() for i, n in enumerate(lengths)]
