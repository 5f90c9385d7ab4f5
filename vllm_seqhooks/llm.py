"""`vllm_seqhooks.LLM`: ``vllm.LLM`` plus ``special_kwargs=``.

With ``special_kwargs=None`` it is exactly ``vllm.LLM`` (same engine, vLLM's
own scheduler). With hooks, it resolves the configuration against the model's
tokenizer (clear errors before any engine starts), installs the fork/join
scheduler through ``scheduler_cls`` and passes the configuration through
``additional_config``. Results of ``generate``/``chat`` carry the hook tree
of each request as ``output.hook_trace`` (None when no hook fired).
"""

from __future__ import annotations

import atexit
import os
import weakref
from typing import Any

import vllm
import vllm.envs

from vllm_seqhooks.config.presets import coerce_special_kwargs
from vllm_seqhooks.config.special_kwargs import SpecialKwargs
from vllm_seqhooks.core.trace import attach_traces
from vllm_seqhooks.engine import patches
from vllm_seqhooks.engine.cpu_memory import cpu_memory_args
from vllm_seqhooks.engine.engine_args import hook_engine_args, load_tokenizer, model_engine_args
from vllm_seqhooks.engine.in_process_steps import step_one_engine_at_a_time
from vllm_seqhooks.engine.worker_exit import worker_exit_grace


class LLM(vllm.LLM):
    """``vllm.LLM`` with sequence hooks (``special_kwargs=``)."""

    def __init__(
        self,
        model: str,
        *,
        special_kwargs: SpecialKwargs | dict[str, Any] | str | None = None,
        **kwargs: Any,
    ) -> None:
        model = os.fspath(model)
        hooks = coerce_special_kwargs(special_kwargs, model)
        self.special_kwargs: SpecialKwargs | None = None
        if hooks is not None:
            if not hooks.is_resolved:
                hooks = hooks.resolve(load_tokenizer(model, **kwargs))
            kwargs = {**kwargs, **model_engine_args(model, kwargs.get)}
            kwargs = {**kwargs, **hook_engine_args(hooks, kwargs), **cpu_memory_args(kwargs)}
            patches.install_frontend_patches()
            with worker_exit_grace():  # (its processes start here)
                super().__init__(model, **kwargs)
        else:
            super().__init__(model, **kwargs)
        self.special_kwargs = hooks
        if hooks is not None:
            if not vllm.envs.VLLM_ENABLE_V1_MULTIPROCESSING:  # (its engine core is in this process)
                step_one_engine_at_a_time(self.llm_engine)
            # Stop the engine before multiprocessing's own exit handler kills
            # its process (registered later, so run earlier): otherwise vLLM's
            # monitor reports "engine core exited unexpectedly" at a normal exit.
            atexit.register(_shutdown_at_exit, weakref.ref(self))

    def generate(self, prompts: Any, sampling_params: Any = None, *args: Any, **kwargs: Any):
        outputs = super().generate(prompts, sampling_params, *args, **kwargs)
        if self.special_kwargs is not None:
            attach_traces(outputs, self.get_tokenizer())
        return outputs

    def chat(self, messages: Any, sampling_params: Any = None, *args: Any, **kwargs: Any):
        outputs = super().chat(messages, sampling_params, *args, **kwargs)
        if self.special_kwargs is not None:
            attach_traces(outputs, self.get_tokenizer())
        return outputs

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the engine now (its EngineCore process, when it has one),
        waiting up to ``timeout`` seconds for it to exit, rather than from the
        interpreter's exit, where vLLM gives it 5 s and then kills it with a
        warning (on 2 CPU cores its worker alone took about 4 s to exit)."""
        self.llm_engine.engine_core.shutdown(timeout=timeout)


def _shutdown_at_exit(llm_ref: "weakref.ref[LLM]") -> None:
    llm = llm_ref()
    if llm is not None:
        llm.shutdown()
