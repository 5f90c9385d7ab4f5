"""Test bodies started ahead, a few at a time, in threads: for tests whose
work is waiting on subprocesses (a documented command, a ``vllm serve``),
so that two such commands share the machine's cores instead of taking turns.
Each test then takes its own result: :meth:`RunAhead.result` re-raises what
its body raised and prints what its body printed with :func:`say` (in that
test's captured output, not in the one running when it was said).

    ahead = RunAhead(workers=2)
    ahead.submit("a", lambda: run_command_a())
    ...
    ahead.result("a")   # in test a: its assertion errors, its lines
    ahead.close()
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

_local = threading.local()


def say(line: str) -> None:
    """Print ``line``, or keep it for its test when said by a body run ahead."""
    kept = getattr(_local, "lines", None)
    if kept is None:
        print(line)
    else:
        kept.append(line)


class RunAhead:
    def __init__(self, workers: int) -> None:
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers),
                                        thread_name_prefix="run-ahead")
        self._futures: dict[str, Future] = {}

    def submit(self, key: str, body: Callable[[], None]) -> None:
        assert key not in self._futures, key
        self._futures[key] = self._pool.submit(_kept, body)

    def __contains__(self, key: str) -> bool:
        return key in self._futures

    def result(self, key: str) -> None:
        lines, error = self._futures[key].result()
        for line in lines:
            print(line)
        if error is not None:
            raise error

    def close(self) -> None:
        """Cancel what has not started; wait for what has."""
        self._pool.shutdown(wait=True, cancel_futures=True)


def _kept(body: Callable[[], None]) -> tuple[list[str], BaseException | None]:
    _local.lines = []
    try:
        body()
        return _local.lines, None
    except BaseException as exc:  # (handed to the test that owns it)
        return _local.lines, exc
    finally:
        _local.lines = None
