"""Shared-memory segments that vLLM's CPU tensor-parallel backend left behind.

Each CPU TP group opens ``/dev/shm/<port>-<group>-[<ranks>]-cpushm_<n>``,
named after its distributed init port; a worker that is killed (as Ray and
multiprocess executors do at shutdown) leaves them there, and a later engine
given the same port fails at start-up with "create shm in SHMManager
failed. errno: 17" (EEXIST). Before each test, the segments no live process
maps are removed, unless they are younger than :data:`MIN_AGE_S` (one that
an engine of a test running beside this one has just created and not mapped
yet: scripts/test.sh runs two lanes at once).
"""

from __future__ import annotations

import time
from pathlib import Path

SHM_DIR = Path("/dev/shm")
PATTERN = "*-cpushm_*"
#: Seconds a segment must have existed before it counts as left behind.
MIN_AGE_S = 10.0


def mapped_paths(proc: Path = Path("/proc")) -> set[str]:
    """Every file path a live process maps (those it may read)."""
    paths: set[str] = set()
    for maps in proc.glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:  # gone, or not ours to read
            continue
        for line in text.splitlines():
            parts = line.split(maxsplit=5)
            if len(parts) == 6:
                paths.add(parts[5].removesuffix(" (deleted)"))
    return paths


def remove_stale_cpu_shm(shm_dir: Path = SHM_DIR, proc: Path = Path("/proc"),
                         min_age_s: float = MIN_AGE_S) -> list[str]:
    """Remove the CPU TP segments in ``shm_dir`` that no live process maps
    and that are older than ``min_age_s``; returns their names."""
    segments = sorted(shm_dir.glob(PATTERN))
    if not segments:
        return []
    in_use = mapped_paths(proc)
    removed = []
    now = time.time()
    for segment in segments:
        if str(segment) in in_use:
            continue
        try:
            if now - segment.stat().st_mtime < min_age_s:
                continue
            segment.unlink()
        except OSError:  # another user's, or gone already
            continue
        removed.append(segment.name)
    return removed
