"""The engine's host work per step: the scheduler's calls, timed.

CPU time of the engine core's process says little here: vLLM's shared-memory
queues busy-poll (a reader spins for a second after each read), so the
engine core's main thread burns its core while it waits for the worker,
exactly as long as the modelled GPU step. What the host must do each step
is the scheduler's work: ``schedule()``, ``update_from_output()`` (where the
hook scheduler spawns and joins) and ``add_request()`` (a client's
requests), which :class:`TimedScheduler` times in thread CPU seconds.

``TimedScheduler`` is a ``scheduler_cls``: it builds the scheduler the
engine would have had (vLLM's own, sync or async, or the one named by
``additional_config["gpu_timed"]["scheduler_cls"]``, the hook scheduler's
factory for an engine with hooks) and hands the engine core a
:class:`TimedCalls` around it, which times those three calls and passes
everything else through. Each timed call looks its method up on the
scheduler when it is made: the hook scheduler binds vLLM's own
``schedule`` on itself while no fork/join work is in flight, and a method
captured once would miss that. Its counters go, as JSON, to
``additional_config["gpu_timed"]["scheduler_stats_path"]`` from a thread.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.gpu_timed.stats_file import keep_stats_written

TIMED_SCHEDULER_PATH = "benchmarks.gpu_timed.timed_scheduler.TimedScheduler"
_TIMED = ("schedule", "update_from_output", "add_request")


class SchedulerClock:
    """Thread CPU seconds in each timed call, the steps that scheduled
    tokens, and how many of those the hook scheduler ran as vLLM's own."""

    def __init__(self) -> None:
        self.cpu_s = dict.fromkeys(_TIMED, 0.0)
        self.steps = 0
        self.request_steps = 0
        self.plain_steps = 0

    def call(self, name: str, method, *args: Any, **kwargs: Any):
        """``method(*args, **kwargs)``, its thread CPU seconds counted under ``name``."""
        t0 = time.thread_time()
        try:
            return method(*args, **kwargs)
        finally:
            self.cpu_s[name] += time.thread_time() - t0

    def count(self, scheduler_output: Any, plain: bool = False) -> None:
        """A step; ``plain``: the hook scheduler ran it as vLLM's own (no
        fork/join work in flight: its ``_plain`` flag)."""
        if scheduler_output.total_num_scheduled_tokens > 0:
            self.steps += 1
            self.request_steps += len(scheduler_output.num_scheduled_tokens)
            self.plain_steps += plain

    def counters(self) -> dict[str, float]:
        return {"steps": self.steps, "request_steps": self.request_steps,
                **{f"{k}_cpu_s": v for k, v in self.cpu_s.items()},
                "scheduler_cpu_s": sum(self.cpu_s.values()), "plain_steps": self.plain_steps}


def _inner_class(vllm_config: Any, path: str | None) -> type:
    if path:
        from vllm.utils.import_utils import resolve_obj_by_qualname

        return resolve_obj_by_qualname(path)
    if vllm_config.scheduler_config.async_scheduling:
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler

        return AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    return Scheduler


class TimedCalls:
    """The engine's scheduler with ``schedule``, ``update_from_output`` and
    ``add_request`` timed by ``clock``; every other attribute is the
    scheduler's own (read and written through)."""

    def __init__(self, scheduler: Any, clock: SchedulerClock) -> None:
        object.__setattr__(self, "_scheduler", scheduler)
        object.__setattr__(self, "_clock", clock)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._scheduler, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._scheduler, name, value)

    def schedule(self, *args: Any, **kwargs: Any):
        scheduler = self._scheduler
        plain = getattr(scheduler, "_plain", False)  # (stock vLLM's: none)
        out = self._clock.call("schedule", scheduler.schedule, *args, **kwargs)
        self._clock.count(out, plain)
        return out

    def update_from_output(self, *args: Any, **kwargs: Any):
        return self._clock.call("update_from_output", self._scheduler.update_from_output,
                                *args, **kwargs)

    def add_request(self, *args: Any, **kwargs: Any):
        return self._clock.call("add_request", self._scheduler.add_request, *args, **kwargs)


class TimedScheduler:
    def __new__(cls, *args: Any, **kwargs: Any):
        vllm_config = kwargs.get("vllm_config", args[0] if args else None)
        cfg = (vllm_config.additional_config or {}).get("gpu_timed") or {}
        scheduler = _inner_class(vllm_config, cfg.get("scheduler_cls"))(*args, **kwargs)
        clock = SchedulerClock()
        path = cfg.get("scheduler_stats_path")
        if path:
            keep_stats_written(path, clock.counters, "gpu-timed-scheduler-stats")
        return TimedCalls(scheduler, clock)


def time_the_hook_scheduler() -> None:
    """In this process, engines with hooks get :class:`TimedScheduler`
    wrapping the hook scheduler (``vllm_seqhooks.LLM`` and the ``vllm
    serve`` flags install the path this replaces; the timed engine reads the
    hook scheduler's path from ``additional_config``, see
    :func:`.engine_args.gpu_timed_engine_args`)."""
    from vllm_seqhooks.engine import engine_args

    engine_args.SCHEDULER_CLASS_PATH = TIMED_SCHEDULER_PATH
