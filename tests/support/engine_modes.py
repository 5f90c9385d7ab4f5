"""vLLM's engine modes, to run the same end-to-end checks on each (tests).

On a GPU vLLM 0.32 runs Model Runner V2 with async scheduling; the CPU build
runs the V1 runner with async scheduling off. Both of the GPU defaults run on
CPU too:

* **V2 runner**: through Triton's interpreter (:mod:`.v2_runner`);
* **async scheduling**: the CPU platform switches it off in
  ``CpuPlatform.check_and_update_config`` as a policy ("not required on
  CPU"); :func:`.async_scheduling.force_async_scheduling` turns it back on
  right after that call, and vLLM then runs its async scheduler (``AsyncScheduler``, ours:
  ``SeqHooksAsyncScheduler``) and the batch queue end to end.

:func:`run_in_mode` calls a function in a process set up for one
:class:`EngineMode` (the runner must be chosen before vLLM is imported),
the session's long-lived one for that mode (:mod:`.mode_workers`);
:class:`ModeProcesses` does it for several modes at once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from tests.support import mode_workers, v2_runner
from tests.support.async_scheduling import ASYNC_ENV


@dataclass(frozen=True)
class EngineMode:
    runner: str  # "v1" | "v2"
    async_scheduling: bool

    @property
    def id(self) -> str:
        return f"{self.runner}-{'async' if self.async_scheduling else 'sync'}"

    def unavailable_reason(self) -> str | None:
        return v2_runner.unavailable_reason() if self.runner == "v2" else None

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of a process running this mode."""
        if self.runner == "v2":
            env = v2_runner.v2_env(base)
        else:
            env = dict(os.environ if base is None else base)
            paths = [str(v2_runner.REPO_ROOT)]
            if env.get("PYTHONPATH"):
                paths.append(env["PYTHONPATH"])
            env["PYTHONPATH"] = os.pathsep.join(paths)
            env["VLLM_USE_V2_MODEL_RUNNER"] = "0"
        env[ASYNC_ENV] = "1" if self.async_scheduling else "0"
        return env


#: The environment of an engine in the calling process (what the functions
#: run in each mode inspect): the same for every file, so that they share
#: the session's process of each mode.
IN_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}

#: vLLM's CPU default first, then the GPU defaults.
MODES = (
    EngineMode("v1", False),
    EngineMode("v1", True),
    EngineMode("v2", False),
    EngineMode("v2", True),
)


def run_in_mode(
    mode: EngineMode,
    target: str | Callable[..., Any],
    *,
    kwargs: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 900,
    fresh: bool = False,
) -> Any:
    """Call ``target(**kwargs)`` in a process running ``mode`` and return
    its JSON result: the session's worker for that environment
    (:mod:`.mode_workers`, which starts one the first time, from
    ``os.environ`` as it was at collection), or with
    ``fresh`` a process of its own (for a function that leaves the process
    unusable for later engines). Raises as
    :func:`.v2_runner.run_in_subprocess`."""
    child_env = mode.env(None if fresh else mode_workers.session_environ())
    child_env.update(env or {})
    run = v2_runner.run_in_subprocess if fresh else mode_workers.call
    return run(target, env=child_env, kwargs=kwargs, timeout=timeout)


class ModeProcesses:
    """:func:`run_in_mode` for each of ``calls`` (mode -> target and its
    keyword arguments; the modes this machine cannot run are left out),
    in processes running at once, at most one per core, each with one
    OpenMP thread: a process of the tiny model keeps about one core busy
    (its steps are Python-bound, the V2 runner's interpreted Triton
    kernels too), so two run in about the time of the longer on two
    cores (with torch's default of a thread per core, their threads would
    spin against each other)."""

    def __init__(self, calls: Mapping[EngineMode, tuple[str | Callable[..., Any],
                                                          Mapping[str, Any]]],
                 *, env: Mapping[str, str] | None = None) -> None:
        runnable = {m: call for m, call in calls.items() if not m.unavailable_reason()}
        workers = max(1, min(len(runnable), os.cpu_count() or 1))
        if workers > 1:  # one OpenMP thread each (torch's default: one per core)
            env = {"OMP_NUM_THREADS": "1", **(env or {})}
        self._pool = ThreadPoolExecutor(max_workers=workers)
        self._futures: dict[EngineMode, Future] = {
            mode: self._pool.submit(run_in_mode, mode, target, kwargs=kwargs, env=env)
            for mode, (target, kwargs) in runnable.items()}

    def result(self, mode: EngineMode) -> Any:
        """The mode's result (waits for it); skips the calling test when
        the mode cannot run here; raises what :func:`run_in_mode` raised."""
        reason = mode.unavailable_reason()
        if reason:
            import pytest

            pytest.skip(reason)
        return self._futures[mode].result()

    def succeeded(self) -> dict[str, Any]:
        """Mode id -> result, of the modes whose process succeeded (waits
        for all)."""
        return {m.id: f.result() for m, f in self._futures.items() if f.exception() is None}

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def one_engine_after_another(run: Callable[..., dict], model: str,
                             cases: Mapping[str, dict[str, Any]]) -> dict[str, dict]:
    """``run(model, **kwargs)`` for each of ``cases``, one engine after
    another in this process (the cases of one engine mode), the garbage of
    each engine collected before the next starts."""
    import gc

    results = {}
    for name, kwargs in cases.items():
        results[name] = run(model, **kwargs)
        gc.collect()
    return results
