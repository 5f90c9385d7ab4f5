"""In-process engines step one at a time in a process.

vLLM's forward context (the step's batch: attention metadata, slot
mappings) is one global of the process (``vllm.forward_context``), not
one per engine or thread. An in-process engine
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the engine core runs in the
caller's thread) stepping while another steps in another thread of the
same process computes with the other's batch: measured 2026-12-06 on the
tiny model, two ``vllm.LLM`` engines in two threads, prompt logprobs off by
up to 19.4 while the other engine stepped, then "Forward context is not
set" raised in the other thread (once, instead, the process aborted with
a heap corruption). A hook engine's steps here wait for any other hook
engine's step in the process to end, so each computes its own batch (an
engine vLLM started without hooks, stepping beside them, is not covered).
With vLLM's default, each engine core is a process of its own and none of
this applies.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

#: Held by the hook engine of this process that is stepping.
_STEPPING = threading.Lock()


def step_one_engine_at_a_time(llm_engine: Any) -> None:
    """``llm_engine.step`` (vLLM's ``LLMEngine``, in-process) holds the
    process's step lock while it runs. The wrapper holds the engine weakly:
    a reference cycle would leave the engine to the garbage collector, whose
    later teardown of it destroys the process's parallel groups under any
    other engine of the process (seen: "pipeline model parallel group is
    not initialized" in the next test's engine, vLLM 0.33)."""
    step = type(llm_engine).step
    engine = weakref.ref(llm_engine)

    def step_alone(*args: Any, **kwargs: Any):
        with _STEPPING:
            return step(engine(), *args, **kwargs)

    llm_engine.step = step_alone
