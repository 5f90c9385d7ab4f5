"""Shared-memory segments that vLLM's CPU tensor-parallel backend left behind.

Each CPU TP group opens ``/dev/shm/<port>-<group>-[<ranks>]-cpushm_<n>``,
named after its distributed init port; a worker that is killed (as Ray and
multiprocess executors do at shutdown) leaves them there, and a later engine
given the same port fails at start-up with "create shm in SHMManager
failed. errno: 17" (EEXIST). Tests that start CPU TP engines remove the
segments no live process maps before they start one.
"""

from __future__ import annotations

from pathlib import Path

SHM_DIR = Path("/dev/shm")
PATTERN = "*-cpushm_*"


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


def remove_stale_cpu_shm(shm_dir: Path = SHM_DIR, proc: Path = Path("/proc")) -> list[str]:
    """Remove the CPU TP segments in ``shm_dir`` that no live process maps;
    returns their names."""
    segments = sorted(shm_dir.glob(PATTERN))
    if not segments:
        return []
    in_use = mapped_paths(proc)
    removed = []
    for segment in segments:
        if str(segment) in in_use:
            continue
        try:
            segment.unlink()
        except OSError:  # another user's, or gone already
            continue
        removed.append(segment.name)
    return removed
