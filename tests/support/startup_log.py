"""Test-only: record each vLLM engine and ``vllm serve`` start-up with the
test that caused it, for the suite's per-file table (``docs/testing.md``).

The tests' ``vllm.general_plugins`` entry point :func:`register` (the same
metadata-only distribution as :mod:`tests.support.ray_on_cpu`) runs in
every vLLM process; with ``SEQHOOKS_TEST_STARTUP_LOG=<file>`` it appends a
line ``<kind>\\t<test id>`` there for each ``EngineCore`` built (in-process
or in its own process: ``engine``) and for each ``vllm serve`` command's
main process (``serve``). The test id is pytest's ``PYTEST_CURRENT_TEST``,
which every process a test starts inherits. Without the variable nothing
is imported or changed. :func:`table` reads the log back.
"""

from __future__ import annotations

import os
import sys
from collections import Counter

ENV_VAR = "SEQHOOKS_TEST_STARTUP_LOG"
_MARK = "_seqhooks_startup_log"
_served = False


def register() -> None:
    if not os.environ.get(ENV_VAR):
        return
    import multiprocessing

    if multiprocessing.current_process().name.startswith("EngineCore"):
        # (an engine's own process: it loads the plugins while its engine is
        # being built, too late to wrap that engine's __init__)
        _record("engine")
        return
    _record_serve()
    from vllm_seqhooks.engine.post_import import when_imported

    when_imported("vllm.v1.engine.core", _wrap_engine_core)


def _record(kind: str) -> None:
    path = os.environ.get(ENV_VAR)
    if not path:
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "(outside a test)").rsplit(" (", 1)[0]
    with open(path, "a") as log:  # (one short line: appends from processes do not interleave)
        log.write(f"{kind}\t{test}\n")


def _record_serve() -> None:
    """Once, in the main process of a ``vllm serve`` command."""
    global _served
    import multiprocessing

    if (not _served and os.path.basename(sys.argv[0]) == "vllm" and sys.argv[1:2] == ["serve"]
            and multiprocessing.parent_process() is None):
        _served = True
        _record("serve")


def _wrap_engine_core() -> None:
    from vllm.v1.engine.core import EngineCore

    original = EngineCore.__init__
    if getattr(original, _MARK, False):
        return

    def __init__(self, *args, **kwargs):
        _record("engine")
        original(self, *args, **kwargs)

    setattr(__init__, _MARK, True)
    EngineCore.__init__ = __init__


def counts(path: str) -> dict[str, Counter]:
    """Start-ups per test file: ``{file: Counter(engine=..., serve=...)}``."""
    out: dict[str, Counter] = {}
    if not os.path.exists(path):
        return out
    with open(path) as log:
        for line in log:
            kind, _, test = line.rstrip("\n").partition("\t")
            out.setdefault(test.split("::", 1)[0], Counter())[kind] += 1
    return out


def table(seconds: dict[str, float], starts: dict[str, Counter], tests: Counter) -> str:
    """A markdown table of the test files, slowest first: seconds, tests,
    engine and ``vllm serve`` start-ups."""
    rows = ["| test file | seconds | tests | engine start-ups | `vllm serve` start-ups |",
            "| --- | ---: | ---: | ---: | ---: |"]
    for path in sorted(seconds, key=seconds.get, reverse=True):
        started = starts.get(path, Counter())
        rows.append(f"| `{path}` | {seconds[path]:.0f} | {tests[path]} | {started['engine']} | "
                    f"{started['serve']} |")
    total = Counter()
    for started in starts.values():
        total.update(started)
    rows.append(f"| all | {sum(seconds.values()):.0f} | {sum(tests.values())} | "
                f"{total['engine']} | {total['serve']} |")
    return "\n".join(rows) + "\n"
