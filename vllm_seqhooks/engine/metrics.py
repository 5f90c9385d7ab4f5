"""Prometheus metrics of the fork/join scheduler.

The scheduler lives in EngineCore's process; vLLM's ``/metrics`` is served by
the API server process(es). The scheduler keeps its counters, gauges and the
park-time histogram in a :class:`HookMetrics` and, when the environment
variable ``SEQHOOKS_METRICS_DIR`` names a directory, writes a JSON
snapshot there (atomically, at most every 0.25 s, and whenever the engine
runs out of requests). A :class:`SnapshotCollector`, registered in the API
server's Prometheus registry by the ``vllm serve`` plugin, reads the
snapshots at scrape time. One file per engine (data-parallel rank), so every
engine shows up with its own ``engine`` label.

When vLLM runs several API server processes it switches prometheus_client
to multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``) and builds a fresh
registry over that directory at each scrape; there the scheduler also updates
real prometheus_client metrics, which that mode shares across processes.

No vLLM import (``prometheus_client`` is imported lazily).
"""

from __future__ import annotations

import json
import os
import time
from bisect import bisect_left
from pathlib import Path
from typing import Any, Iterator

ENV_DIR = "SEQHOOKS_METRICS_DIR"
PREFIX = "vllm:seqhooks_"
PARK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                30.0, 60.0, 120.0, 300.0)

#: counter name -> help text
COUNTERS = {
    "children_spawned": "Child requests spawned by <promise> payloads.",
    "joins": "Joins: a parked parent merged its children and resumed or finished.",
    "spills": "Parked parents whose KV blocks were freed under memory pressure.",
    "preemptions": "Requests preempted by vLLM while the hook scheduler ran.",
    "merged_tokens": "Child output tokens merged into parents.",
    "join_prefill_tokens": "Tokens prefilled by parents when they resumed after a join.",
    "join_reused_tokens": "Tokens whose KV cache parents kept across a join.",
    "fork_prompt_tokens": "Prompt tokens of child requests.",
    "fork_cached_tokens": "Prompt tokens of child requests served by the prefix cache.",
    "promises_ignored": "Promises left as plain text (limits, empty payloads).",
    "truncated_merges": "Merges cut at max_model_len.",
    "children_cut": "Children cut (finish reason length) because their family spent its token budget or passed its deadline.",
    "child_timeouts": "Children failed because they outlived the child timeout.",
    "family_deadlines": "Families cut because they outlived the family timeout.",
    "fair_share_preemptions": "Children preempted to give a waiting request its fair share of running slots.",
    "children_deferred": "Children of tag-format forks that waited for the live-children limits before starting.",
    "splice_joins": "Joins that took the children's KV (join='splice') instead of prefilling their outputs.",
    "spliced_tokens": "Tokens whose KV parents took from their children at splice joins.",
    "splice_joins_after_spill": "Splice joins of parents whose KV was spilled while they waited (their context's KV taken back from the prefix cache and their first child).",
    "splice_adopted_tokens": "Tokens of first paths whose KV blocks parents adopted from their first child at splice joins (not copied).",
    "splice_child_context_copied_tokens": "Tokens of children's context taken from their parked parent's KV instead of computed (join='splice': its partly filled last block, or without the prefix cache the whole context).",
    "splice_holds_released": "Finished children that gave back the KV blocks held for their parent's splice join (nothing ran and a waiting request needed them): that join re-prefills.",
    "splice_fallbacks": "Splice joins done by re-prefill because a path's KV was not all there.",
    "splice_recomputes": "Requests holding spliced KV that vLLM preempted (recomputed at their positions; see splice_recomputed_tokens).",
    "splice_recomputed_tokens": "Tokens of spliced paths computed again with causal attention (a later path then sees an earlier one): their blocks were gone from the prefix cache.",
}
#: outcome label values of vllm:seqhooks_children_ended_total
OUTCOMES = ("finished", "failed", "aborted")
GAUGES = {
    "open_children": "Child requests running or waiting.",
    "parked_requests": "Requests parked at <sync> waiting for their children.",
    "deferred_children": "Children of tag-format forks waiting for the live-children limits.",
}


class HookMetrics:
    """Counters, gauges and the park-time histogram of one scheduler."""

    def __init__(self, engine: str, model_name: str, directory: str | None = None,
                 *, mirror: bool = True) -> None:
        self.engine = engine
        self.model_name = model_name
        self.counters: dict[str, int] = {name: 0 for name in COUNTERS}
        self.ended: dict[str, int] = {o: 0 for o in OUTCOMES}
        self.gauges: dict[str, int] = {name: 0 for name in GAUGES}
        self.park_buckets = [0] * (len(PARK_BUCKETS) + 1)
        self.park_sum = 0.0
        self.park_count = 0
        self.directory = Path(directory) if directory else None
        self._path = (
            self.directory / f"engine-{engine}-{os.getpid()}.json" if self.directory else None
        )
        self._last_write = 0.0
        self._dirty = False
        self._prom = (
            _PrometheusMirror(engine, model_name)
            if mirror and os.environ.get("PROMETHEUS_MULTIPROC_DIR") else None
        )

    def inc(self, name: str, value: int = 1) -> None:
        self.counters[name] += value
        self._dirty = True
        if self._prom is not None:
            self._prom.counters[name].inc(value)

    def child_ended(self, outcome: str) -> None:
        self.ended[outcome] += 1
        self._dirty = True
        if self._prom is not None:
            self._prom.ended[outcome].inc()

    def observe_park(self, seconds: float) -> None:
        self.park_buckets[bisect_left(PARK_BUCKETS, seconds)] += 1
        self.park_sum += seconds
        self.park_count += 1
        self._dirty = True
        if self._prom is not None:
            self._prom.park.observe(seconds)

    def set_gauges(self, **values: int) -> None:
        for k, v in values.items():
            if self.gauges[k] != v:
                self.gauges[k] = v
                self._dirty = True
                if self._prom is not None:
                    self._prom.gauges[k].set(v)

    def snapshot(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "model_name": self.model_name,
            "counters": dict(self.counters),
            "ended": dict(self.ended),
            "gauges": dict(self.gauges),
            "park_seconds": {
                "buckets": list(self.park_buckets),
                "sum": self.park_sum,
                "count": self.park_count,
            },
            "time": time.time(),
        }

    def maybe_write(self, force: bool = False) -> None:
        """Write the snapshot if there is a directory and something changed."""
        if self._path is None or not (self._dirty or force):
            return
        now = time.monotonic()
        if not force and now - self._last_write < 0.25:
            return
        tmp = self._path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(self.snapshot()))
            os.replace(tmp, self._path)
        except OSError:  # metrics must never break serving
            return
        self._last_write = now
        self._dirty = False

    def remove(self) -> None:
        if self._path is not None:
            try:
                self._path.unlink()
            except OSError:
                pass


_PROM_METRICS: dict[str, Any] = {}


def _prom_metric(cls, name: str, doc: str, labels: list[str], **kwargs: Any):
    """One prometheus_client metric per name and process."""
    if name not in _PROM_METRICS:
        _PROM_METRICS[name] = cls(name, doc, labels, **kwargs)
    return _PROM_METRICS[name]


class _PrometheusMirror:
    """The same metrics as prometheus_client objects (multiprocess mode)."""

    def __init__(self, engine: str, model_name: str) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        labels = {"model_name": model_name, "engine": engine}
        names = list(labels)
        self.counters = {
            n: _prom_metric(Counter, PREFIX + n, doc, names).labels(**labels)
            for n, doc in COUNTERS.items()
        }
        ended = _prom_metric(Counter, PREFIX + "children_ended",
                             "Child requests that ended, by outcome.", [*names, "outcome"])
        self.ended = {o: ended.labels(**labels, outcome=o) for o in OUTCOMES}
        self.gauges = {
            n: _prom_metric(Gauge, PREFIX + n, doc, names,
                            multiprocess_mode="mostrecent").labels(**labels)
            for n, doc in GAUGES.items()
        }
        self.park = _prom_metric(Histogram, PREFIX + "park_time_seconds",
                                 "Time requests spent parked at <sync>.", names,
                                 buckets=PARK_BUCKETS).labels(**labels)


def _writer_alive(path: Path) -> bool:
    """Snapshots are named ``engine-<engine>-<pid>.json``; a snapshot whose
    process is gone (an engine that crashed or was killed without removing
    it) is stale."""
    try:
        pid = int(path.stem.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_snapshots(directory: str | os.PathLike) -> list[dict[str, Any]]:
    """The snapshots of the engines that are still running."""
    out = []
    for path in sorted(Path(directory).glob("engine-*.json")):
        if not _writer_alive(path):
            continue
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return out


class SnapshotCollector:
    """A prometheus_client collector over the engines' snapshot files."""

    def __init__(self, directories: "list[str | os.PathLike] | str | os.PathLike") -> None:
        #: The directories read (a list the caller may add to later).
        self.directories = directories if isinstance(directories, list) else [directories]

    def describe(self):  # no fixed description: metrics appear at collect()
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        snaps = [s for d in list(self.directories) for s in read_snapshots(Path(d))]
        labels = ["model_name", "engine"]
        for name, doc in COUNTERS.items():
            fam = CounterMetricFamily(PREFIX + name, doc, labels=labels)
            for s in snaps:
                fam.add_metric([s["model_name"], s["engine"]], s["counters"].get(name, 0))
            yield fam
        fam = CounterMetricFamily(PREFIX + "children_ended",
                                  "Child requests that ended, by outcome.",
                                  labels=[*labels, "outcome"])
        for s in snaps:
            for outcome in OUTCOMES:
                fam.add_metric([s["model_name"], s["engine"], outcome],
                               s["ended"].get(outcome, 0))
        yield fam
        for name, doc in GAUGES.items():
            fam = GaugeMetricFamily(PREFIX + name, doc, labels=labels)
            for s in snaps:
                fam.add_metric([s["model_name"], s["engine"]], s["gauges"].get(name, 0))
            yield fam
        fam = HistogramMetricFamily(PREFIX + "park_time_seconds",
                                    "Time requests spent parked at <sync>.", labels=labels)
        for s in snaps:
            h = s["park_seconds"]
            cumulative, buckets = 0, []
            for bound, count in zip([*map(str, PARK_BUCKETS), "+Inf"], h["buckets"]):
                cumulative += count
                buckets.append((bound, cumulative))
            fam.add_metric([s["model_name"], s["engine"]], buckets, h["sum"])
        yield fam
