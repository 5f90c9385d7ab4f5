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

:func:`run_in_mode` calls a function in a fresh process set up for one
:class:`EngineMode` (the runner must be chosen before vLLM is imported).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tests.support import v2_runner
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
) -> Any:
    """Call ``target(**kwargs)`` in a fresh process running ``mode`` and
    return its JSON result (see :func:`.v2_runner.run_in_subprocess`)."""
    child_env = mode.env()
    child_env.update(env or {})
    return v2_runner.run_in_subprocess(target, env=child_env, kwargs=kwargs, timeout=timeout)
