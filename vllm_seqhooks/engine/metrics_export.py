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
``additional_config``) exports them too (:func:`enable_metrics_for`). That
one names its directory in the engine's own configuration
(``additional_config["seqhooks_metrics_dir"]``), not in the environment: a
process that runs engines itself (a trainer, a test run) must not hand its
directory to the ``vllm serve`` processes it starts, whose ``/metrics``
would then show its engines too.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

#: The key of ``additional_config`` that names an engine's snapshot directory
#: when the environment does not (:func:`enable_metrics_for`).
CONFIG_KEY = "seqhooks_metrics_dir"
#: The snapshot directories this process's collector reads.
_directories: list[str] = []


def enable_metrics() -> None:
    """Export the scheduler's metrics on the API server's ``/metrics``.

    Names a snapshot directory for the engines (``SEQHOOKS_METRICS_DIR``,
    inherited by the EngineCore processes started after this) and registers
    a collector over it in this process's Prometheus registry."""
    from vllm_seqhooks.engine.metrics import ENV_DIR

    if not os.environ.get(ENV_DIR):
        os.environ[ENV_DIR] = _new_directory()
    carry_env_to_ray_actors()
    install_collector(os.environ[ENV_DIR])


def enable_metrics_for(vllm_config) -> None:
    """The same for one engine about to start from ``vllm_config`` when the
    ``vllm serve`` flags did not set it up: its directory goes in its
    ``additional_config`` (:data:`CONFIG_KEY`)."""
    from vllm_seqhooks.engine.metrics import ENV_DIR

    if os.environ.get(ENV_DIR):
        install_collector(os.environ[ENV_DIR])
        return
    config = vllm_config.additional_config
    if not isinstance(config, dict):
        return
    directory = config.get(CONFIG_KEY) or _new_directory()
    config[CONFIG_KEY] = directory
    install_collector(directory)


def metrics_directory(vllm_config) -> str | None:
    """Where an engine writes its snapshots (None: nowhere)."""
    from vllm_seqhooks.engine.metrics import ENV_DIR

    config = vllm_config.additional_config
    named = config.get(CONFIG_KEY) if isinstance(config, dict) else None
    return os.environ.get(ENV_DIR) or named


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
