"""Long-lived processes that run test functions, one per environment, shared
by the whole pytest session (issue 51: a process per file and engine mode
paid the import of torch and vLLM, and Triton's for V2, each time; about
10 CPU-seconds, 17 times in a run on vLLM 0.32).

:func:`call` runs ``target(**kwargs)`` (JSON in and out, as
:func:`tests.support.v2_runner.run_in_subprocess`) in an idle worker whose
environment is ``env``, starting one when there is none. A worker is one
fresh process started with that environment (so whatever must be decided
before vLLM is imported -- the model runner, async scheduling, OpenMP's
thread count -- is), which then serves calls one after another. Between
calls it puts back what a call may leave behind in the process:
``os.environ`` as it was before the call (the functions set
``VLLM_ENABLE_V1_MULTIPROCESSING`` there), vLLM's cache of environment
variables (``vllm.envs.disable_envs_cache``, which an engine's start turns
on, as conftest does between tests), and the garbage of the call's
engines. A call that fails, times out or kills its process retires the
worker: the next call gets a fresh one. A function that leaves the process
unusable for later engines (vLLM 0.32's ngram proposer, see
tests/test_forkjoin_task.py) asks for a fresh process instead
(:func:`tests.support.engine_modes.run_in_mode`'s ``fresh``).

Workers start from :func:`session_environ` (``os.environ`` as it was at
collection) plus what the caller adds. Variables that change from test to
test without changing the process (:data:`PER_CALL`: pytest's current
test, which the start-up log reads; vLLM's CPU worker's identifier, which
it sets itself) are not part of the environment a worker is chosen by; the
current test's is set for the call. Each worker's output goes to a log
file; a failure's message holds the part the call wrote. The workers are
stopped at the end of the session (tests/conftest.py) or when the
interpreter exits.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tests.support.v2_runner import V2RunError, read_result, run_request, target_spec

#: Variables a worker is not chosen by: ``PYTEST_CURRENT_TEST`` is set for
#: each call, ``VLLM_DIST_IDENT`` is set by vLLM's CPU worker itself.
PER_CALL = frozenset({"PYTEST_CURRENT_TEST", "VLLM_DIST_IDENT"})


#: ``os.environ`` when this module was first imported (at collection,
#: before any test's engine ran in pytest's process and vLLM's CPU platform
#: set its variables there: about ten, ``LD_PRELOAD`` among them, which
#: would otherwise make every later environment a new one).
_SESSION_ENVIRON = {k: v for k, v in os.environ.items() if k not in PER_CALL}


def session_environ() -> dict[str, str]:
    """The environment to start workers from: :data:`_SESSION_ENVIRON`
    with the current test's id (a copy)."""
    env = dict(_SESSION_ENVIRON)
    if "PYTEST_CURRENT_TEST" in os.environ:
        env["PYTEST_CURRENT_TEST"] = os.environ["PYTEST_CURRENT_TEST"]
    return env


def _key(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in env.items() if k not in PER_CALL))


class _Worker:
    """One process serving calls (the other end: :func:`_serve`)."""

    def __init__(self, env: Mapping[str, str], workdir: Path) -> None:
        self.log_path = Path(tempfile.mkstemp(prefix="worker-", suffix=".log", dir=workdir)[1])
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", __name__], env=dict(env), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._log, start_new_session=True)

    def run(self, request: dict, timeout: float) -> Any:
        """``request``'s JSON result; raises ``V2RunError`` (the function
        failed, or the process ended) or ``subprocess.TimeoutExpired``."""
        start = self.log_path.stat().st_size
        with tempfile.TemporaryDirectory(prefix="seqhooks-call-") as tmp:
            request_path, result_path = Path(tmp, "request.json"), Path(tmp, "result.json")
            request_path.write_text(json.dumps(request))
            try:
                self.proc.stdin.write(f"{request_path}\t{result_path}\n".encode())
                self.proc.stdin.flush()
            except BrokenPipeError:
                pass  # (ended: reported below, as for a death during the call)
            answer = self._wait_for_answer(timeout)
            result = read_result(result_path) if answer == "done" else None
        if answer == "timeout":
            raise subprocess.TimeoutExpired(self.proc.args, timeout)
        if result is None:
            try:
                status = self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                status = None
            raise V2RunError(f"the worker process ended (exit status {status})"
                             f"\n--- output (tail) ---\n{self._output_since(start)}")
        if not result.get("ok"):
            raise V2RunError(f"{result['error']}\n--- output (tail) ---\n"
                             f"{self._output_since(start)}")
        return result["result"]

    def _wait_for_answer(self, timeout: float) -> str:
        """``"done"``, ``"ended"`` (the process closed its end) or
        ``"timeout"``."""
        readable = select.select([self.proc.stdout], [], [], timeout)[0]
        if not readable:
            return "timeout"
        return "done" if self.proc.stdout.readline() == b"done\n" else "ended"

    def _output_since(self, offset: int) -> str:
        with self.log_path.open("rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")[-6000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self._log):
            stream.close()


class WorkerPool:
    """Idle workers by environment (:func:`_key`); thread-safe: calls of
    several threads at once each get a worker of their own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[tuple, list[_Worker]] = {}
        self._busy: set[_Worker] = set()
        self._dir: tempfile.TemporaryDirectory | None = None
        self.started = 0

    def call(self, target: str | Callable[..., Any], *, env: Mapping[str, str],
             kwargs: Mapping[str, Any] | None = None, timeout: float = 900) -> Any:
        per_call = {"PYTEST_CURRENT_TEST": env["PYTEST_CURRENT_TEST"]} \
            if "PYTEST_CURRENT_TEST" in env else {}
        request = {"target": target_spec(target), "kwargs": dict(kwargs or {}), "env": per_call}
        worker = self._take(env)
        ok = False
        try:
            value = worker.run(request, timeout)
            ok = True
            return value
        finally:
            self._give_back(env, worker, reuse=ok)

    def _take(self, env: Mapping[str, str]) -> _Worker:
        with self._lock:
            idle = self._idle.get(_key(env))
            worker = idle.pop() if idle else None
            if worker is None:
                if self._dir is None:
                    self._dir = tempfile.TemporaryDirectory(prefix="seqhooks-workers-")
                worker = _Worker(env, Path(self._dir.name))
                self.started += 1
            self._busy.add(worker)
            return worker

    def _give_back(self, env: Mapping[str, str], worker: _Worker, reuse: bool) -> None:
        with self._lock:
            self._busy.discard(worker)
            if reuse and worker.proc.poll() is None:
                self._idle.setdefault(_key(env), []).append(worker)
                return
        worker.stop()

    def stop(self) -> None:
        """Stops every worker (idle or busy: their calls then fail)."""
        with self._lock:
            workers = [w for ws in self._idle.values() for w in ws] + list(self._busy)
            self._idle.clear()
            self._busy.clear()
        for worker in workers:
            worker.stop()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None


#: The session's pool.
POOL = WorkerPool()
atexit.register(POOL.stop)


def call(target: str | Callable[..., Any], *, env: Mapping[str, str],
         kwargs: Mapping[str, Any] | None = None, timeout: float = 900) -> Any:
    """``target(**kwargs)`` in the session's worker for ``env`` (see the
    module's docstring)."""
    return POOL.call(target, env=env, kwargs=kwargs, timeout=timeout)


# ------------------------------------------------------------- the worker


def _reset_after_call(environ: dict[str, str]) -> None:
    import gc

    os.environ.clear()
    os.environ.update(environ)
    envs = sys.modules.get("vllm.envs")
    if envs is not None and hasattr(envs, "disable_envs_cache"):
        envs.disable_envs_cache()
    gc.collect()


def _serve() -> int:
    """The worker's loop: a line ``request<TAB>result`` per call on stdin,
    ``done`` on its own stdout when the result file is written. The
    functions' own output (``print`` included) goes to stderr, the log."""
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    for line in sys.stdin:
        request_path, result_path = line.rstrip("\n").split("\t")
        environ = dict(os.environ)
        os.environ.update(json.loads(Path(request_path).read_text()).get("env", {}))
        try:
            run_request(request_path, result_path)
        finally:
            _reset_after_call(environ)
        answers.write("done\n")
        answers.flush()
    return 0


if __name__ == "__main__":
    sys.exit(_serve())
