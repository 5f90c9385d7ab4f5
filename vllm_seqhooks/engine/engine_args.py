"""The engine arguments of an engine with hooks, for both entry points
(``vllm_seqhooks.LLM``'s keyword arguments and ``vllm serve``'s flags): the
fork/join scheduler, the worker extension, the configuration in
``additional_config``; the tokenizer those arguments name; and, inside the
engine, the hook settings and model name read back from its config."""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Mapping

from vllm_seqhooks.config.engine_defaults import defaults_to_apply
from vllm_seqhooks.config.presets import model_engine_defaults
from vllm_seqhooks.config.special_kwargs import (
    ADDITIONAL_CONFIG_KEY, SpecialKwargs, SpecialKwargsError)
from vllm_seqhooks.engine import SCHEDULER_CLASS_PATH, WORKER_EXTENSION_CLASS_PATH

logger = logging.getLogger("vllm.seqhooks.engine_args")

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


def model_engine_args(model: str, given: Callable[[str], Any]) -> dict[str, Any]:
    """The engine defaults ``model`` carries (its ``seqhooks.json``'s
    ``"engine"``) that the user left unset: ``given(name)`` is the user's
    value of engine argument ``name`` or None (vLLM's own default counts as
    unset for ``gpu_memory_utilization``, as in :mod:`.cpu_memory`)."""
    defaults = model_engine_defaults(model)
    if not defaults:
        return {}
    from vllm.engine.arg_utils import EngineArgs

    def user_set(name: str) -> bool:
        if name == "VLLM_CPU_KVCACHE_SPACE":
            return bool(os.environ.get(name))
        value = given(name)
        return value is not None and not (
            name == "gpu_memory_utilization" and value == EngineArgs.gpu_memory_utilization)

    chosen = defaults_to_apply(defaults, user_set)
    if chosen:
        logger.info("vllm-seqhooks: engine defaults carried by %s/seqhooks.json: %s (your own "
                    "flags or arguments replace them)", model, chosen)
    return chosen


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


def engine_hooks(vllm_config) -> SpecialKwargs:
    """The engine's hook settings, resolved against its tokenizer if needed."""
    hooks = SpecialKwargs.from_additional_config(vllm_config.additional_config)
    if hooks is None:
        raise ValueError(
            f"SeqHooksScheduler needs additional_config['{ADDITIONAL_CONFIG_KEY}'] (a "
            "SpecialKwargs dict); use vllm_seqhooks.LLM(special_kwargs=...) or the "
            "vllm serve flags")
    if not hooks.is_resolved:
        from vllm.tokenizers import cached_tokenizer_from_config

        tokenizer = cached_tokenizer_from_config(vllm_config.model_config)
        hooks = hooks.resolve(tokenizer, vllm_config.model_config.get_vocab_size())
    hooks.check_vocab(vllm_config.model_config.get_vocab_size())
    return hooks


def served_model_name(model_config) -> str:
    """The engine's model name as its metrics label it."""
    name = model_config.served_model_name
    if isinstance(name, (list, tuple)):
        name = name[0]
    return str(name or model_config.model)
