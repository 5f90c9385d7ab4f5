"""Which model runner vLLM runs, to pick the scripted-token logits processor
class it accepts (:mod:`.processor` for the V1 runner, :mod:`.processor_v2`
for Model Runner V2)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from vllm.config import VllmConfig


def uses_v2_model_runner(config: VllmConfig | Mapping[str, Any] | None = None) -> bool:
    """Whether vLLM runs (or will run) Model Runner V2.

    ``config`` is a ``VllmConfig`` (its ``use_v2_model_runner``, vLLM's own
    decision), or the keyword arguments of ``vllm.LLM`` / ``EngineArgs``
    (``model`` included), or ``None``.  For arguments, the answer is
    ``VLLM_USE_V2_MODEL_RUNNER`` when set (unless they hold a watermark or
    attention configuration, which can force V2), ``False`` without a usable
    Triton, else vLLM's decision on the ``VllmConfig`` built from them.  For
    ``None``: the variable when set, else whether Triton is usable (ignoring
    features V2 lacks).
    """
    if config is not None and not isinstance(config, Mapping):
        return bool(config.use_v2_model_runner)
    import vllm.envs as envs
    from vllm.triton_utils import HAS_TRITON

    forced = envs.VLLM_USE_V2_MODEL_RUNNER
    if config is None:
        return bool(HAS_TRITON) if forced is None else bool(forced)
    may_force_v2 = "watermark_config" in config or "attention_config" in config
    if not may_force_v2:
        if forced is not None:
            return bool(forced)
        if not HAS_TRITON:
            return False
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    names = {f.name for f in dataclasses.fields(EngineArgs)}
    args = EngineArgs(**{k: v for k, v in config.items() if k in names})
    return bool(args.create_engine_config().use_v2_model_runner)
