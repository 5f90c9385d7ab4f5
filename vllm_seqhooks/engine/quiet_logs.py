"""vLLM warnings that are not true for an engine with hooks, kept out of
the log (each named with why; docs/install.md lists the vLLM warnings a
successful CPU run still prints, and why they stay).

A logging filter on the vLLM logger that emits the warning drops that one
record and nothing else: the same logger's other records, and the same
warning for any other scheduler class, pass."""

from __future__ import annotations

import logging

from vllm_seqhooks.engine import SCHEDULER_CLASS_PATH

#: (logger name, the start of the message format) -> why the record is dropped.
DROPPED: dict[tuple[str, str], str] = {
    ("vllm.config.scheduler", "Using custom scheduler class"):
        "it says a Scheduler subclass loses async scheduling; the hook scheduler "
        "takes vLLM's async or sync scheduler as its base at run time, as vLLM "
        "chose for the engine (vllm_seqhooks.engine.scheduler)",
}


class _DropNotTrueForHooks(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(self.prefix):
            return True
        return not any(_names_hook_scheduler(arg) for arg in (record.args or ()))


def _names_hook_scheduler(arg: object) -> bool:
    if isinstance(arg, str):
        return arg == SCHEDULER_CLASS_PATH
    return f"{getattr(arg, '__module__', '')}.{getattr(arg, '__qualname__', '')}" == (
        SCHEDULER_CLASS_PATH)


def install() -> None:
    """Add the filters (once per process)."""
    for (name, prefix) in DROPPED:
        log = logging.getLogger(name)
        if not any(isinstance(f, _DropNotTrueForHooks) and f.prefix == prefix
                   for f in log.filters):
            log.addFilter(_DropNotTrueForHooks(prefix))
