"""benchmarks.gpu_timed.host_split: the GPU-timed servers' engine processes
on half of the CPUs, their API server and the clients on the other half."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from benchmarks.gpu_timed.host_split import descendants, halves, split_host


def test_halves_split_the_cpus_in_two():
    assert halves({0, 1}) == ({0}, {1})
    assert halves({0, 1, 2, 3, 4}) == ({0, 1}, {2, 3, 4})
    assert halves({3}) == ({3}, {3})


# A stand-in for `vllm serve`: a process whose child names itself as vLLM
# names its engine processes, with a thread started before the split.
_TREE = """
import os, subprocess, sys, threading, time
child = subprocess.Popen([sys.executable, "-c", '''
import threading, time
open("/proc/self/comm", "w").write("VLLM::EngineCor")
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
print("ready", flush=True)
time.sleep(60)
'''], stdout=subprocess.PIPE, text=True)
child.stdout.readline()
print(child.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_the_engine_processes_and_the_frontend_get_different_cpus():
    own = os.sched_getaffinity(0)
    server = subprocess.Popen([sys.executable, "-c", _TREE], stdout=subprocess.PIPE, text=True)
    try:
        engine_pid = int(server.stdout.readline())
        assert engine_pid in descendants(server.pid)
        engine_cpus, frontend_cpus = halves()
        assert split_host(server.pid) == [engine_pid]
        for tid in os.listdir(f"/proc/{engine_pid}/task"):  # every thread
            assert os.sched_getaffinity(int(tid)) == engine_cpus
        assert os.sched_getaffinity(server.pid) == frontend_cpus
        assert os.sched_getaffinity(0) == frontend_cpus  # the clients: this process
        # A second server, split while this process sits on the frontend
        # half: its engine still goes to the engine half.
        second = subprocess.Popen([sys.executable, "-c", _TREE], stdout=subprocess.PIPE,
                                  text=True)
        try:
            second_engine = int(second.stdout.readline())
            assert split_host(second.pid) == [second_engine]
            assert os.sched_getaffinity(second_engine) == engine_cpus != frontend_cpus
            assert os.sched_getaffinity(second.pid) == frontend_cpus
        finally:
            second.kill()
            second.wait()
    finally:
        os.sched_setaffinity(0, own)
        server.kill()
        server.wait()
    with pytest.raises(RuntimeError, match="no VLLM"):  # nothing to split: said
        lone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            time.sleep(0.2)
            split_host(lone.pid)
        finally:
            os.sched_setaffinity(0, own)
            lone.kill()
            lone.wait()
