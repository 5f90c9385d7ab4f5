"""The GPU-timed servers' engine processes on cores of their own.

On a GPU host the engine core's busy loop and the worker wait for a GPU
while the API server and the clients have cores to spare. Here the GPU's
step is a sleep, and both engine processes spin on vLLM's shared-memory
queues while they wait (``shm_broadcast``'s reader busy-loops for a second
after each message): on two cores they took both and starved the API
server and the benchmark's clients, whose requests then reached the engine
late (measured: at 8 families ``vllm bench serve``'s per-family latencies
all equal to the longest family's, the client loop 2-6x the steps it
needs). :func:`split_host` puts every thread of the engine processes on the
first half of this process's CPUs and the API server's and this process's
(the clients) on the other half, so the frontend's share no longer depends
on how the spinning goes.
"""

from __future__ import annotations

import os
from pathlib import Path

ENGINE_PREFIX = "VLLM::"  # vLLM names its EngineCore and Worker processes so

#: This process's CPUs before any split moved it to the frontend half: every
#: split divides these (a second server split by what the first one left,
#: the frontend half alone, had its engine on the frontend's CPU).
HOST_CPUS = frozenset(os.sched_getaffinity(0))


def halves(cpus: set[int] | frozenset[int] = HOST_CPUS) -> tuple[set[int], set[int]]:
    """(engine CPUs, frontend CPUs): the host's CPUs split in two; on one
    CPU, both are that one."""
    cpus = sorted(cpus)
    if len(cpus) < 2:
        return set(cpus), set(cpus)
    half = len(cpus) // 2
    return set(cpus[:half]), set(cpus[half:])


def _children(pid: int) -> list[int]:
    kids = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        path = task / "children"
        if path.exists():
            kids += [int(x) for x in path.read_text().split()]
    return kids


def _name(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        for kid in _children(todo.pop()):
            out.append(kid)
            todo.append(kid)
    return out


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` on ``cpus`` (threads it starts later inherit)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except ProcessLookupError:
            pass


def split_host(server_pid: int) -> list[int]:
    """The server's engine processes (``VLLM::...``) on the engine half,
    the server's other processes and this one on the frontend half;
    returns the engine processes' pids (none found: an error, the split
    would not be what the figures say)."""
    engine_cpus, frontend_cpus = halves()
    engines = []
    for pid in [server_pid, *descendants(server_pid)]:
        try:
            is_engine = _name(pid).startswith(ENGINE_PREFIX)
            pin(pid, engine_cpus if is_engine else frontend_cpus)
        except FileNotFoundError:
            continue
        if is_engine:
            engines.append(pid)
    if not engines:
        raise RuntimeError(f"no {ENGINE_PREFIX}* process under pid {server_pid}")
    pin(os.getpid(), frontend_cpus)
    return engines
