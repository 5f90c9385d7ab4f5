"""vLLM's warning that a custom scheduler class loses async scheduling is
not true for the hook scheduler and is dropped; the same warning for any
other class, and the logger's other records, pass."""

from __future__ import annotations

import logging

from vllm_seqhooks.engine import SCHEDULER_CLASS_PATH, quiet_logs


def _warnings_for(scheduler_cls, caplog):
    from vllm.config import SchedulerConfig

    config = SchedulerConfig.__new__(SchedulerConfig)  # (only the fields the method reads)
    config.scheduler_cls = scheduler_cls
    config.async_scheduling = False
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vllm.config.scheduler"):
        try:
            config.get_scheduler_cls()
        except (ImportError, ValueError, AttributeError):
            pass  # (a made-up class does not resolve; its warning came first)
    return [r.getMessage() for r in caplog.records if "custom scheduler" in r.getMessage()]


def test_only_the_hook_schedulers_warning_is_dropped(caplog):
    quiet_logs.install()
    quiet_logs.install()  # (once per process, however often called)
    log = logging.getLogger("vllm.config.scheduler")
    assert sum(isinstance(f, quiet_logs._DropNotTrueForHooks) for f in log.filters) == 1
    assert _warnings_for(SCHEDULER_CLASS_PATH, caplog) == []
    assert len(_warnings_for("somebody.else.Scheduler", caplog)) == 1
