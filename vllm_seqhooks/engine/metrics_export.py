"""The hook scheduler's metrics on the frontend's ``/metrics``.

The scheduler (EngineCore's process) writes snapshots to the directory
``SEQHOOKS_METRICS_DIR`` names (:mod:`.metrics`); a collector in the
frontend's Prometheus registry reads them at scrape time.
:func:`enable_metrics` sets both up; it must run in the frontend's process
before the engines start (they inherit the variable). It runs for every
engine with hooks: from the ``vllm serve`` flags (:mod:`.serve_flags`), and
from the frontend's request check (:mod:`.vllm_private.frontend`), which
vLLM builds before it starts the engine, so a server that gets its hook
settings as engine arguments (verl's, from ``scheduler_cls`` and
``additional_config``) exports them too (:func:`enable_engine_metrics`).

A directory the user names (``SEQHOOKS_METRICS_DIR`` set by hand: storage
that a headless rank on another node shares) is always used. One made here
is handed to the engines in the environment, which every process started
later inherits, so it carries its owner (``SEQHOOKS_METRICS_OWNER``,
``serve:<pid>:<directory>`` or ``engine:<pid>:<directory>``): a ``vllm
serve`` reuses it only from another ``vllm serve`` process (its own API
servers), and an engine's frontend only from a ``vllm serve`` or from its
own process. A process that runs engines itself (a trainer, a test run) and
starts ``vllm serve`` processes thus gives each its own directory, whose
``/metrics`` shows its engines only. (Not in the engine's
``additional_config``: that is part of vLLM's config hash, which names the
compile caches.)
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

#: Who made the directory ``SEQHOOKS_METRICS_DIR`` names, and which it was:
#: ``serve:<pid>:<directory>`` or ``engine:<pid>:<directory>`` (absent, or
#: naming another directory: the user named it).
OWNER_ENV = "SEQHOOKS_METRICS_OWNER"
#: The snapshot directories this process's collector reads.
_directories: list[str] = []


def enable_metrics() -> None:
    """Export the scheduler's metrics on the API server's ``/metrics``
    (``vllm serve``): names a snapshot directory for the engines
    (``SEQHOOKS_METRICS_DIR``, inherited by the EngineCore processes started
    after this) and has this process's collector read it."""
    _use_directory("serve", reuse_from=lambda kind, pid: kind == "serve")


def enable_engine_metrics() -> None:
    """The same for an engine about to start in a frontend the ``vllm serve``
    flags did not set up (verl's server, a trainer's own ``AsyncLLM``); the
    engines of one such process share its directory."""
    _use_directory("engine", reuse_from=lambda kind, pid: kind == "serve" or pid == os.getpid())


def _use_directory(kind: str, reuse_from) -> None:
    from vllm_seqhooks.engine.metrics import ENV_DIR

    inherited = os.environ.get(ENV_DIR)
    owner_kind, _, rest = os.environ.get(OWNER_ENV, "").partition(":")
    owner_pid, _, owner_dir = rest.partition(":")
    # (owner_dir != inherited: the user named it)
    if not inherited or (owner_dir == inherited and not reuse_from(
            owner_kind, int(owner_pid) if owner_pid.isdigit() else -1)):
        directory = _new_directory()
        os.environ[ENV_DIR] = directory
        os.environ[OWNER_ENV] = f"{kind}:{os.getpid()}:{directory}"
    carry_env_to_ray_actors()
    install_collector(os.environ[ENV_DIR])


def _new_directory() -> str:
    path = tempfile.mkdtemp(prefix="vllm-seqhooks-metrics-")
    atexit.register(shutil.rmtree, path, True)
    return path


#: vLLM copies environment variables with these prefixes to the Ray actors
#: it starts (engine actors of Ray data parallelism, Ray workers).
RAY_PREFIXES_ENV = "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY"


def carry_env_to_ray_actors() -> None:
    """Have vLLM copy the ``SEQHOOKS_`` variables (the metrics directory
    above) to the Ray actors it starts, as it copies its own ``VLLM_`` ones:
    an engine of Ray data parallelism runs in such an actor."""
    prefixes = [p for p in os.environ.get(RAY_PREFIXES_ENV, "").split(",") if p.strip()]
    if "SEQHOOKS_" not in prefixes:
        os.environ[RAY_PREFIXES_ENV] = ",".join([*prefixes, "SEQHOOKS_"])


def install_collector(directory: str) -> None:
    """Have this process's collector (registered once in prometheus' default
    registry, which vLLM serves on /metrics with one API server process)
    read ``directory`` too. (With several API server processes, vLLM uses
    prometheus multiprocess mode, and the scheduler updates prometheus_client
    metrics directly: see metrics.py.)"""
    from vllm_seqhooks.engine.metrics import SnapshotCollector

    if directory in _directories:
        return
    if not _directories:
        from prometheus_client import REGISTRY

        REGISTRY.register(SnapshotCollector(_directories))
    _directories.append(directory)
