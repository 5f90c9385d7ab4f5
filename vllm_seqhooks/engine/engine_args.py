"""The engine arguments of an engine with hooks, for both entry points
(``vllm_seqhooks.LLM``'s keyword arguments and ``vllm serve``'s flags): the
fork/join scheduler, the worker extension, the configuration in
``additional_config``; and the tokenizer those arguments name."""

from __future__ import annotations

from typing import Any, Mapping

from vllm_seqhooks.config.special_kwargs import SpecialKwargs, SpecialKwargsError
from vllm_seqhooks.engine import SCHEDULER_CLASS_PATH, WORKER_EXTENSION_CLASS_PATH

KV_TRANSFER_REFUSAL = (
    "sequence hooks cannot be combined with kv_transfer_config: KV connectors "
    "treat a parent parked at <sync> as a finished request"
)


def hook_engine_args(hooks: SpecialKwargs, args: Mapping[str, Any],
                     names: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The engine arguments to set, given the user's ``args`` (engine
    argument name -> value). Raises :class:`SpecialKwargsError` for
    arguments hooks cannot be combined with, naming them as ``names`` says
    (e.g. command-line flags)."""
    names = names or {}
    if args.get("kv_transfer_config") is not None:
        raise SpecialKwargsError(
            f"{names.get('kv_transfer_config', 'kv_transfer_config')}: {KV_TRANSFER_REFUSAL}")
    current = args.get("scheduler_cls")
    if current not in (None, SCHEDULER_CLASS_PATH):
        raise SpecialKwargsError(
            f"{names.get('scheduler_cls', 'scheduler_cls')} {current!r} cannot be combined "
            "with sequence hooks, which install their own scheduler")
    return {
        "scheduler_cls": SCHEDULER_CLASS_PATH,
        "worker_extension_cls": args.get("worker_extension_cls") or WORKER_EXTENSION_CLASS_PATH,
        "additional_config": hooks.to_additional_config(args.get("additional_config")),
    }


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
