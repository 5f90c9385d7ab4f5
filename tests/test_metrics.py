"""HookMetrics snapshots and the Prometheus collector over them."""

from __future__ import annotations

import json
import os
import subprocess

from vllm_seqhooks.engine.metrics import PARK_BUCKETS, HookMetrics, SnapshotCollector, read_snapshots


def test_snapshot_round_trip_and_throttle(tmp_path):
    m = HookMetrics("0", "tiny", str(tmp_path))
    m.inc("children_spawned", 3)
    m.child_ended("aborted")
    m.observe_park(0.02)
    m.set_gauges(open_children=2, parked_requests=1)
    m.maybe_write()
    (snap,) = read_snapshots(tmp_path)
    assert snap["counters"]["children_spawned"] == 3
    assert snap["ended"]["aborted"] == 1
    assert snap["gauges"] == {"open_children": 2, "parked_requests": 1, "deferred_children": 0}
    m.inc("joins")
    m.maybe_write()  # within 0.25 s: throttled
    assert read_snapshots(tmp_path)[0]["counters"]["joins"] == 0
    m.maybe_write(force=True)
    assert read_snapshots(tmp_path)[0]["counters"]["joins"] == 1
    m.remove()
    assert read_snapshots(tmp_path) == []


def test_without_directory_nothing_is_written(tmp_path):
    m = HookMetrics("0", "tiny", None)
    m.inc("joins")
    m.maybe_write(force=True)
    assert list(tmp_path.iterdir()) == []


def test_collector_exposition(tmp_path):
    from prometheus_client import CollectorRegistry, generate_latest

    for engine, spawned in (("0", 2), ("1", 5)):
        m = HookMetrics(engine, "tiny", str(tmp_path))
        m.inc("children_spawned", spawned)
        m.observe_park(0.003)
        m.observe_park(1000.0)
        m.maybe_write(force=True)
    (tmp_path / f"engine-9-{os.getpid()}.json").write_text("{not json")  # ignored
    # a snapshot left by a process that is gone is stale
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = HookMetrics("7", "tiny", str(tmp_path))
    stale.inc("children_spawned", 99)
    stale.maybe_write(force=True)
    stale._path.rename(tmp_path / f"engine-7-{dead.pid}.json")
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(tmp_path))
    text = generate_latest(registry).decode()
    assert 'vllm:seqhooks_children_spawned_total{engine="0",model_name="tiny"} 2.0' in text
    assert 'vllm:seqhooks_children_spawned_total{engine="1",model_name="tiny"} 5.0' in text
    assert 'vllm:seqhooks_park_time_seconds_bucket{engine="0",le="0.005",model_name="tiny"} 1.0' in text
    assert 'vllm:seqhooks_park_time_seconds_bucket{engine="0",le="+Inf",model_name="tiny"} 2.0' in text
    assert 'vllm:seqhooks_children_ended_total{engine="0",model_name="tiny",outcome="failed"} 0.0' in text
    assert "vllm:seqhooks_parked_requests" in text
    assert 'engine="7"' not in text
    assert len(PARK_BUCKETS) + 1 == len(json.loads((tmp_path / next(
        p.name for p in tmp_path.iterdir() if p.name.startswith("engine-0"))).read_text())
        ["park_seconds"]["buckets"])


def test_a_metrics_directory_is_not_shared_with_the_servers_a_process_starts(monkeypatch,
                                                                            tmp_path):
    """A process that runs an engine with hooks itself (verl's server, a
    trainer, a test run) names a snapshot directory in its environment,
    which the ``vllm serve`` processes it starts later inherit: each of
    those takes a directory of its own (its ``/metrics`` must not show the
    first process's engines), while a ``vllm serve``'s own API server
    processes share its directory. A directory the user names is used by
    all."""
    from vllm_seqhooks.engine import metrics_export
    from vllm_seqhooks.engine.metrics import ENV_DIR

    def owner():
        return os.environ[metrics_export.OWNER_ENV]

    for name in (ENV_DIR, metrics_export.OWNER_ENV):
        monkeypatch.delenv(name, raising=False)
    metrics_export.enable_engine_metrics()  # a frontend of this process
    engines = os.environ[ENV_DIR]
    assert owner() == f"engine:{os.getpid()}:{engines}"
    metrics_export.enable_engine_metrics()  # another engine of this process: the same
    assert os.environ[ENV_DIR] == engines
    metrics_export.enable_metrics()  # as a vllm serve started by it (inheriting): its own
    served = os.environ[ENV_DIR]
    assert served != engines and owner() == f"serve:{os.getpid()}:{served}"
    monkeypatch.setenv(metrics_export.OWNER_ENV, f"serve:1:{served}")  # that serve's API servers
    metrics_export.enable_metrics()
    assert os.environ[ENV_DIR] == served
    metrics_export.enable_engine_metrics()  # a frontend inside a vllm serve: its directory
    assert os.environ[ENV_DIR] == served
    monkeypatch.setenv(metrics_export.OWNER_ENV, f"engine:1:{served}")  # another process's
    metrics_export.enable_engine_metrics()
    assert os.environ[ENV_DIR] not in (engines, served)
    # The user names a directory (shared storage, for a headless rank): a
    # vllm serve uses it, whoever the inherited owner names.
    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    metrics_export.enable_metrics()
    assert os.environ[ENV_DIR] == str(tmp_path)
    monkeypatch.delenv(metrics_export.OWNER_ENV)
    metrics_export.enable_metrics()
    assert os.environ[ENV_DIR] == str(tmp_path)
    assert {engines, served} <= set(metrics_export._directories)


def test_the_serving_docs_list_every_metric():
    """docs/serving.md's metrics table names every counter, gauge and the
    histogram the engine exports, and nothing else."""
    import re
    from pathlib import Path

    from vllm_seqhooks.engine.metrics import COUNTERS, GAUGES

    page = (Path(__file__).resolve().parents[1] / "docs" / "serving.md").read_text()
    listed = set(re.findall(r"^\| `vllm:seqhooks_(\w+?)(?:\{\w+\})?` \|", page, re.M))
    exported = ({f"{name}_total" for name in COUNTERS} | {"children_ended_total"}
                | set(GAUGES) | {"park_time_seconds"})
    assert listed == exported
