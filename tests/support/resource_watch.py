"""The resident memory of a process and all its descendants, sampled in a
thread: the peak a documented command reaches (issue 49: at most 3 GiB for
each), for tests that start ``vllm serve`` or an ``LLM`` in a subprocess.

The figure is the sum of the tree's RSS at each sample (every 0.2 s by
default): pages shared between the processes (the libraries each maps) are
counted once per process, so it is an upper bound of what the tree holds,
and a peak shorter than the interval can be missed.

    with TreeMemory(proc.pid) as memory:
        ...
    memory.peak  # bytes
"""

from __future__ import annotations

import threading
import time

import psutil

GIB = 1 << 30


def tree_rss(pid: int) -> int:
    """RSS of ``pid`` and its descendants now, in bytes (0 once it is gone)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            pass  # ended between the listing and the reading
    return total


class PeriodicSampler:
    """Calls :meth:`sample` every ``interval`` seconds in a thread from
    :meth:`start` to :meth:`stop` (one last sample first), or as a context
    manager."""

    def __init__(self, interval: float, name: str) -> None:
        self.interval = interval
        self._name = name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> object:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def start(self):
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self.sample()
            self._stop.set()
            self._thread.join()
            self._thread = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class TreeMemory(PeriodicSampler):
    """Samples :func:`tree_rss` of ``pid`` every ``interval`` seconds from
    :meth:`start` to :meth:`stop` (or as a context manager); ``peak`` is the
    largest sample, ``samples`` their number."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        super().__init__(interval, name=f"tree-memory-{pid}")
        self.pid = pid
        self.peak = 0
        self.samples = 0

    def sample(self) -> int:
        rss = tree_rss(self.pid)
        self.peak = max(self.peak, rss)
        self.samples += 1
        return rss

    def stop(self) -> int:
        """Stop sampling (one last sample first); returns the peak."""
        super().stop()
        return self.peak

    @property
    def peak_gib(self) -> float:
        return self.peak / GIB


class Stopwatch:
    """Seconds since it was made (``time.monotonic``)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def __call__(self) -> float:
        return time.monotonic() - self.t0
