"""Where a command's CPU-seconds go, by kind of process (issue 51's
measurements; docs/testing.md, "How long it takes").

    .venv/bin/python -m tests.support.cpu_profile --out /tmp/profile.json -- bash scripts/test.sh

runs the command and, once a second while it runs, reads every process's
user + system time (psutil's, from ``/proc``: the machine's processes, not
only the command's descendants, so whatever else runs is shown too). At the end it writes each
process seen (command line, parent, CPU-seconds, first and last seen, and
the test that was running where it started: its ``PYTEST_CURRENT_TEST``) to
``--out`` and prints the CPU-seconds by kind (:func:`kind`). A process that
lives less than a second may be missed, and the last second of each is not
counted: the totals are a little low. Exits with the command's status.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tests.support.resource_watch import PeriodicSampler


def read_processes() -> dict[str, dict]:
    """``pid:start time`` -> ``{"pid", "ppid", "cmd", "cpu_s"}`` of every
    process now (``cmd`` empty once it is a zombie)."""
    now = {}
    for proc in psutil.process_iter(["pid", "ppid", "create_time", "cpu_times", "cmdline"]):
        info = proc.info
        if info["cpu_times"] is None:  # (not readable, or gone while listed)
            continue
        now[f"{info['pid']}:{info['create_time']}"] = {
            "pid": info["pid"], "ppid": info["ppid"],
            "cmd": " ".join(info["cmdline"] or ())[:400],
            "cpu_s": info["cpu_times"].user + info["cpu_times"].system}
    return now


def current_test(pid: int) -> str:
    """The ``PYTEST_CURRENT_TEST`` a process started with ('' if none, or
    not readable): which test's work it is, for processes a test started
    (pytest sets it in its own environment for each test)."""
    try:
        return psutil.Process(pid).environ().get("PYTEST_CURRENT_TEST", "")
    except (psutil.Error, OSError):
        return ""


class Sampler(PeriodicSampler):
    """Every process's CPU-seconds (:func:`read_processes`) every
    ``interval`` seconds; ``processes``: each one seen, by ``pid:start time``,
    with the last command line it had (a process first seen between its
    fork and its exec still has its parent's)."""

    def __init__(self, interval: float = 1.0) -> None:
        super().__init__(interval, name="cpu-profile")
        self.processes: dict[str, dict] = {}
        self._t0 = time.monotonic()

    def sample(self) -> None:
        at = round(time.monotonic() - self._t0, 1)
        for key, now in read_processes().items():
            seen = self.processes.get(key)
            if seen is None:
                seen = self.processes[key] = {"pid": now["pid"], "ppid": now["ppid"],
                                              "cmd": "", "first_s": at,
                                              "test": current_test(now["pid"])}
            seen["cpu_s"], seen["last_s"] = now["cpu_s"], at
            seen["cmd"] = now["cmd"] or seen["cmd"]


def kind(cmd: str) -> str:
    """What a process is, from its command line (a spawned process of
    vLLM's: an EngineCore or a worker)."""
    if "seqhooks-mode=" in cmd:
        return "upstream scheduler tests (pytest)"
    if cmd.startswith("VLLM::") or "spawn_main" in cmd or "multiprocessing.spawn" in cmd:
        # (vLLM retitles the processes it spawns: VLLM::EngineCore, VLLM::Worker_TP0, ...)
        return "spawned vLLM process (EngineCore, worker)"
    if "vllm.model_executor.models.registry" in cmd:
        return "vLLM model-class inspection"
    if "tests.support.v2_runner" in cmd or "tests.support.mode_workers" in cmd:
        return "engine-mode process (tests.support.v2_runner, mode_workers)"
    if " serve " in f"{cmd} " and "vllm" in cmd:
        return "vllm serve (API server)"
    if "-m pytest" in cmd:
        return "pytest" + (" (vLLM 0.33 venv)" if "venv033" in cmd else "")
    if "ray" in cmd.lower():
        return "Ray"
    if " pip " in f" {cmd} " or "-m pip" in cmd:
        return "pip"
    return "other"


def by_kind(processes: dict[str, dict]) -> list[tuple[str, float, int]]:
    """(kind, CPU-seconds, processes), most CPU first."""
    totals: dict[str, list] = collections.defaultdict(lambda: [0.0, 0])
    for p in processes.values():
        entry = totals[kind(p.get("cmd", ""))]
        entry[0] += p.get("cpu_s", 0.0)
        entry[1] += 1
    return sorted(((k, round(s, 1), n) for k, (s, n) in totals.items()), key=lambda r: -r[1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="JSON of every process seen")
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS]")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the command after --")
    sampler = Sampler(args.interval).start()
    t0 = time.monotonic()
    status = subprocess.call(command)
    wall = time.monotonic() - t0
    sampler.stop()
    processes = sampler.processes
    args.out.write_text(json.dumps({"command": command, "wall_s": round(wall, 1),
                                    "processes": processes}))
    rows = by_kind(processes)
    print(f"cpu_profile: {wall:.0f} s wall, {sum(r[1] for r in rows):.0f} CPU-seconds sampled"
          f" ({os.cpu_count()} cores); by kind:", file=sys.stderr)
    for name, cpu_s, count in rows:
        print(f"  {cpu_s:8.1f} s  {count:5d} processes  {name}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
