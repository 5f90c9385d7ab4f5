"""Counters a GPU-timed engine's processes publish: a JSON file rewritten
(atomically) by a daemon thread within a fraction of a second of each change."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

#: How often the thread looks for a change (a reader waits :data:`SETTLED_S`).
WRITE_EVERY_S = 0.1
#: After a run, how long until its last counts are in the file.
SETTLED_S = 2.5 * WRITE_EVERY_S


def write_stats(path: str | os.PathLike[str], counters: dict[str, Any]) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(counters, f)
    os.replace(tmp, path)


def keep_stats_written(path: str | os.PathLike[str], counters: Callable[[], dict[str, Any]],
                       name: str) -> None:
    """Start the thread that writes ``counters()`` to ``path`` when it changes."""

    def loop() -> None:
        written = None
        while True:
            now = counters()
            if now != written:
                write_stats(path, now)
                written = now
            time.sleep(WRITE_EVERY_S)

    threading.Thread(target=loop, daemon=True, name=name).start()
