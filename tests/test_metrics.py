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


def test_an_engine_given_hooks_as_engine_arguments_names_its_directory_in_its_config(
        monkeypatch):
    """A frontend not started by the ``vllm serve`` flags (verl's server, a
    trainer's own engine) gets its snapshot directory in the engine's
    ``additional_config``, not in the environment: the ``vllm serve``
    processes such a process starts later must not share it (their
    ``/metrics`` would show its engines too)."""
    from types import SimpleNamespace

    from vllm_seqhooks.engine import metrics_export
    from vllm_seqhooks.engine.metrics import ENV_DIR

    monkeypatch.delenv(ENV_DIR, raising=False)
    config = SimpleNamespace(additional_config={"seqhooks": {}})
    metrics_export.enable_metrics_for(config)
    directory = config.additional_config[metrics_export.CONFIG_KEY]
    assert ENV_DIR not in os.environ
    assert metrics_export.metrics_directory(config) == directory
    assert directory in metrics_export._directories  # read by this process's collector
    monkeypatch.setenv(ENV_DIR, "/served")  # a vllm serve process: its flags' directory
    assert metrics_export.metrics_directory(config) == "/served"
