"""`vllm_seqhooks.LLM`: ``vllm.LLM`` plus ``special_kwargs=``.

With ``special_kwargs=None`` it is exactly ``vllm.LLM`` (same engine, vLLM's
own scheduler). With hooks, it resolves the configuration against the model's
tokenizer (clear errors before any engine starts), installs the fork/join
scheduler through ``scheduler_cls`` and passes the configuration through
``additional_config``. Results of ``generate``/``chat`` carry the hook tree
of each request as ``output.hook_trace`` (None when no hook fired).
"""

from __future__ import annotations

import os
from typing import Any

import vllm

from vllm_seqhooks.config import (
    WORKER_EXTENSION_QUALNAME,
    SpecialKwargs,
    coerce_special_kwargs,
)
from vllm_seqhooks import _vllm_private
from vllm_seqhooks.trace import attach_traces

SCHEDULER_QUALNAME = "vllm_seqhooks.scheduler.SeqHooksScheduler"
KV_TRANSFER_REFUSAL = (
    "sequence hooks cannot be combined with kv_transfer_config: KV connectors "
    "treat a parent parked at <sync> as a finished request"
)


def load_tokenizer(model: str, **engine_kwargs: Any):
    """The tokenizer vLLM would load for these engine arguments."""
    from vllm.tokenizers import get_tokenizer

    kwargs: dict[str, Any] = {
        "trust_remote_code": engine_kwargs.get("trust_remote_code", False),
    }
    if engine_kwargs.get("tokenizer_revision") is not None:
        kwargs["revision"] = engine_kwargs["tokenizer_revision"]
    mode = engine_kwargs.get("tokenizer_mode")
    if mode is not None:
        kwargs["tokenizer_mode"] = mode
    return get_tokenizer(engine_kwargs.get("tokenizer") or model, **kwargs)


def engine_kwargs_for_hooks(
    hooks: SpecialKwargs, engine_kwargs: dict[str, Any]
) -> dict[str, Any]:
    """Engine arguments that install the fork/join scheduler."""
    if engine_kwargs.get("scheduler_cls") not in (None, SCHEDULER_QUALNAME):
        raise ValueError(
            "special_kwargs installs its own scheduler; scheduler_cls="
            f"{engine_kwargs['scheduler_cls']!r} cannot be combined with it"
        )
    if engine_kwargs.get("kv_transfer_config") is not None:
        raise ValueError(KV_TRANSFER_REFUSAL)
    out = dict(engine_kwargs)
    out["scheduler_cls"] = SCHEDULER_QUALNAME
    if not out.get("worker_extension_cls"):
        out["worker_extension_cls"] = WORKER_EXTENSION_QUALNAME
    out["additional_config"] = hooks.to_additional_config(
        engine_kwargs.get("additional_config")
    )
    return out


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
            kwargs = engine_kwargs_for_hooks(hooks, kwargs)
            _vllm_private.install_request_validator()
        super().__init__(model, **kwargs)
        self.special_kwargs = hooks

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
