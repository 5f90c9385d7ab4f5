"""Async scheduling on vLLM's CPU build (tests and benchmarks).

The CPU platform switches async scheduling off in
``CpuPlatform.check_and_update_config`` as a policy ("not required on CPU");
:func:`force_async_scheduling` turns it back on right after that call, and
vLLM then runs its async scheduler and the batch queue end to end.
"""

from __future__ import annotations

import os

#: Set to "1" in a process's environment: async scheduling on (see
#: :func:`apply_async_scheduling_from_env`).
ASYNC_ENV = "SEQHOOKS_TEST_ASYNC_SCHEDULING"

_ASYNC_MARK = "_seqhooks_forced_async"


def force_async_scheduling() -> None:
    """Keep async scheduling on for engines configured after this call in
    this process (and the engine-core processes they start, which receive
    the configuration). Idempotent."""
    from vllm.platforms.cpu import CpuPlatform

    current = CpuPlatform.__dict__["check_and_update_config"]
    func = current.__func__
    if getattr(func, _ASYNC_MARK, False):
        return

    def check_and_update_config(cls, vllm_config):
        func(cls, vllm_config)
        vllm_config.scheduler_config.async_scheduling = True

    setattr(check_and_update_config, _ASYNC_MARK, True)
    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)


def apply_async_scheduling_from_env() -> None:
    """:func:`force_async_scheduling` when the environment asks for it."""
    if os.environ.get(ASYNC_ENV) == "1":
        force_async_scheduling()
