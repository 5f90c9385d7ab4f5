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
``additional_config``) exports them too.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

_collector_installed = False


def enable_metrics() -> None:
    """Export the scheduler's metrics on the API server's ``/metrics``.

    Names a snapshot directory for the engines (``SEQHOOKS_METRICS_DIR``,
    inherited by the EngineCore processes started after this) and registers
    a collector over it in this process's Prometheus registry."""
    from vllm_seqhooks.engine.metrics import ENV_DIR

    if not os.environ.get(ENV_DIR):
        path = tempfile.mkdtemp(prefix="vllm-seqhooks-metrics-")
        os.environ[ENV_DIR] = path
        atexit.register(shutil.rmtree, path, True)
    carry_env_to_ray_actors()
    install_collector()


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


def install_collector() -> None:
    """Register the snapshot collector (once per process) in prometheus'
    default registry, which vLLM serves on /metrics with one API server
    process. (With several, vLLM uses prometheus multiprocess mode, and the
    scheduler updates prometheus_client metrics directly: see metrics.py.)"""
    global _collector_installed
    from vllm_seqhooks.engine.metrics import ENV_DIR, SnapshotCollector

    directory = os.environ.get(ENV_DIR)
    if _collector_installed or not directory:
        return
    from prometheus_client import REGISTRY

    collector = SnapshotCollector(directory)
    REGISTRY.register(collector)
    _collector_installed = True
