"""``examples/rl_rollout.py``, which docs/rl.md's rollout sketch names as
the sketch run whole. (The README's Python snippet and its serve-and-ask
commands, with every other block of README.md and docs/, are run as pasted
by tests/test_docs_commands.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.crash_like import crash_like

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_rl_rollout_example_runs_reproducibly():
    """``examples/rl_rollout.py --problems 3``: its third group (``sort 9=``)
    never forks and still gets its rows; the seeded samples repeat run to
    run, in vLLM's multiprocess engine and in an in-process one; the process
    exits cleanly. (The two runs go at once, each on one
    OpenMP thread: each is mostly one busy process at a time, so two share
    the machine's cores, where two with torch's thread per core would spin
    against each other; both runs alike, so run to run still compares the
    same thing.)"""
    cmd = [sys.executable, str(ROOT / "examples" / "rl_rollout.py"), "--problems", "3"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    # The first as pasted (vLLM's multiprocess engine: its shutdown is
    # checked); the second with the engine in the example's process, which
    # spawns two processes fewer and must sample the same seeded tokens.
    envs = [env, {**env, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}]
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=run_env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for run_env in envs]
    runs = [_finished(proc, timeout=600) for proc in procs]
    for proc in runs:
        output = proc.stdout + proc.stderr
        assert proc.returncode == 0, output[-3000:]
        assert not crash_like(output), crash_like(output)
    groups = [[line for line in proc.stdout.splitlines()
               if line.startswith(("problem", "  reward"))] for proc in runs]
    assert groups[0] == groups[1]
    assert "problem 2: 'sort 9='" in runs[0].stdout
    (plain,) = [i for i, line in enumerate(groups[0]) if line.startswith("problem 2")]
    assert all("1 per-call rows" in line for line in groups[0][plain + 1:plain + 9])


def _finished(proc: subprocess.Popen, timeout: float) -> subprocess.CompletedProcess:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
