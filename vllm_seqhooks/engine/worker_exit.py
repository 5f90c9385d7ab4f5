"""How long an engine's process waits for its worker process to exit at
shutdown before vLLM kills it.

vLLM gives the worker ``VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS`` (5 s by
default), read in the engine's own process, which inherits the variable when
it starts. On a busy 2-core machine the CPU worker took longer: vLLM then
logs "workers still running after grace period; sending SIGTERM" and kills
it (issue 51 item 6: the verl example, the demo under load). A quiet
shutdown takes about a second; :data:`WORKER_EXIT_S` only bounds a slow one.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

ENV_VAR = "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS"
WORKER_EXIT_S = 30


@contextlib.contextmanager
def worker_exit_grace() -> Iterator[None]:
    """While an engine starts inside it, its processes inherit
    :data:`WORKER_EXIT_S` seconds for the worker's exit, unless the user set
    the variable; the caller's environment is as before afterwards."""
    if ENV_VAR in os.environ:
        yield
        return
    os.environ[ENV_VAR] = str(WORKER_EXIT_S)
    try:
        yield
    finally:
        os.environ.pop(ENV_VAR, None)
