"""The session's long-lived worker processes (``tests.support.mode_workers``):
a call runs in a process started with its environment, reused by the next
call with the same environment, and nothing a call leaves in ``os.environ``
reaches the next; a failure, a death or a timeout retires the worker.
(Functions that import no vLLM: the mechanism, not the engines, which the
engine-mode files run through it.)"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from tests.support.mode_workers import WorkerPool
from tests.support.v2_runner import REPO_ROOT, V2RunError


def where(mark: str | None = None) -> dict:
    seen = {"pid": os.getpid(), "mark": os.environ.get("SEQHOOKS_TEST_MARK"),
            "mode": os.environ.get("SEQHOOKS_TEST_MODE"),
            "test": os.environ.get("PYTEST_CURRENT_TEST")}
    if mark:
        os.environ["SEQHOOKS_TEST_MARK"] = mark
    return seen


def meet(directory: str, count: int) -> int:
    """Waits until ``count`` calls are in here at once (at most 60 s)."""
    import tempfile
    import time

    tempfile.mkstemp(dir=directory)
    deadline = time.monotonic() + 60
    while len(os.listdir(directory)) < count:
        assert time.monotonic() < deadline, "the other call never came"
        time.sleep(0.05)
    return os.getpid()


def fail(how: str) -> None:
    if how == "raise":
        print("the output of the call")
        raise ValueError("failed as asked")
    if how == "exit":
        print("about to end", flush=True)
        os._exit(3)
    if how == "hang":
        threading.Event().wait()


def _env(mode: str = "a", **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SEQHOOKS_TEST_MARK"}
    env.update(PYTHONPATH=str(REPO_ROOT), SEQHOOKS_TEST_MODE=mode, **extra)
    return env


@pytest.fixture
def pool():
    p = WorkerPool()
    yield p
    p.stop()


def test_calls_with_one_environment_share_a_process_and_not_what_a_call_left(pool):
    first = pool.call(where, env=_env(PYTEST_CURRENT_TEST="tests/x.py::an_earlier_test (call)"),
                      kwargs={"mark": "left by the first call"})
    second = pool.call(where, env=_env())
    assert second["pid"] == first["pid"] != os.getpid()
    assert second["mark"] is None  # os.environ put back after the first
    assert second["mode"] == "a"
    # the test that calls, not the one that started the process
    assert second["test"] == os.environ["PYTEST_CURRENT_TEST"]
    other = pool.call(where, env=_env("b"))
    assert other["pid"] != first["pid"] and other["mode"] == "b"
    assert pool.started == 2


@pytest.mark.parametrize("how, error", [
    ("raise", r"ValueError: failed as asked(.|\n)*the output of the call"),
    ("exit", r"the worker process ended \(exit status 3\)(.|\n)*about to end"),
])
def test_a_failure_or_a_death_is_reported_and_the_next_call_gets_a_new_process(pool, how, error):
    before = pool.call(where, env=_env())
    with pytest.raises(V2RunError, match=error):
        pool.call(fail, env=_env(), kwargs={"how": how})
    after = pool.call(where, env=_env())
    assert after["pid"] != before["pid"]
    assert pool.started == 2


def test_a_call_past_its_timeout_is_killed(pool):
    before = pool.call(where, env=_env())
    with pytest.raises(subprocess.TimeoutExpired):
        pool.call(fail, env=_env(), kwargs={"how": "hang"}, timeout=2)
    with pytest.raises(ProcessLookupError):
        os.kill(before["pid"], 0)
    assert pool.call(where, env=_env())["pid"] != before["pid"]


def test_calls_at_once_each_get_a_process(pool, tmp_path):
    """Two calls that each wait for the other: they meet only if each has
    a process of its own."""
    pids = []

    def call():
        pids.append(pool.call(meet, env=_env(), kwargs={"directory": str(tmp_path), "count": 2}))

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(pids)) == 2 and pool.started == 2
    # both idle again: the next call reuses one
    assert pool.call(where, env=_env())["pid"] in pids


def test_stopping_the_pool_ends_its_processes(pool):
    pid = pool.call(where, env=_env())["pid"]
    pool.stop()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert sys.modules["tests.support.mode_workers"].POOL is not pool
