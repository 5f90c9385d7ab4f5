"""Helpers shared by tests, benchmarks and examples that drive fork/join on
the tiny model with scripted tokens (imports vLLM)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from vllm_seqhooks.testing.scripted import (
    ScriptedTokensLogitsProcessor,
    encode_script,
    scripted_params,
)
from vllm_seqhooks.testing.tiny_model import (
    EOS_ID,
    PROMISE_END_ID,
    PROMISE_ID,
    SYNC_ID,
    TINY_ENGINE_KWARGS,
)

#: Hook configuration matching the tiny model's tokens.
TINY_HOOKS: dict[str, Any] = dict(
    sync_token_id=SYNC_ID,
    promise_token_id=PROMISE_ID,
    promise_end_token_id=PROMISE_END_ID,
)


def scripted_processor_for(use_v2: Any) -> type:
    """The scripted processor class for a model runner.

    ``use_v2`` is a ``VllmConfig`` (vLLM's own decision,
    ``VllmConfig.use_v2_model_runner``) or a bool (e.g. from
    :func:`vllm_seqhooks.testing.v2_runner.uses_v2_model_runner`).
    """
    if not isinstance(use_v2, bool):
        use_v2 = use_v2.use_v2_model_runner
    if use_v2:
        from vllm_seqhooks.testing.scripted_v2 import ScriptedTokensLogitsProcessorV2

        return ScriptedTokensLogitsProcessorV2
    return ScriptedTokensLogitsProcessor


def scripted_engine_kwargs(model: str, **engine_kwargs: Any) -> dict[str, Any]:
    """Engine keyword arguments for the tiny model: ``TINY_ENGINE_KWARGS``
    updated with ``engine_kwargs``, plus the scripted-token logits processor
    for the model runner vLLM will use (V1 or V2, see
    :func:`vllm_seqhooks.testing.v2_runner.uses_v2_model_runner`) unless
    ``logits_processors`` is given."""
    from vllm_seqhooks.testing.v2_runner import uses_v2_model_runner

    kwargs = {**TINY_ENGINE_KWARGS, **engine_kwargs}
    if "logits_processors" not in kwargs:
        use_v2 = uses_v2_model_runner({"model": model, **kwargs})
        kwargs["logits_processors"] = [scripted_processor_for(use_v2)]
    return kwargs


def hook_llm(model: str, *, hooks: Mapping[str, Any] | None = None, **engine_kwargs: Any):
    """A ``vllm_seqhooks.LLM`` on the tiny model with the scripted-token
    logits processor installed (see :func:`scripted_engine_kwargs`)."""
    from vllm_seqhooks.llm import LLM

    kwargs = scripted_engine_kwargs(model, **engine_kwargs)
    return LLM(model, special_kwargs={**TINY_HOOKS, **(hooks or {})}, **kwargs)


class Scripts:
    """Turns ``"ab<promise>xy</promise><sync>"`` into token ids."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def __call__(self, text: str) -> list[int]:
        return encode_script(self.tokenizer, text)

    def text(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def params(
        self,
        script: str | Sequence[int] | None,
        children: Mapping[str, str | Sequence[int]] | None = None,
        *,
        end: str = "eos",
        child_end: str | None = "eos",
        **kwargs: Any,
    ):
        """Scripted greedy ``SamplingParams``; scripts end with EOS unless
        ``end="free"``."""
        return scripted_params(
            None if script is None else self._ids(script),
            child_scripts=(
                {k: self._ids(v) for k, v in children.items()} if children else None
            ),
            end=end,
            child_end=child_end,
            eos_token_id=EOS_ID,
            **kwargs,
        )

    def _ids(self, s: str | Sequence[int]) -> list[int]:
        return self(s) if isinstance(s, str) else [int(t) for t in s]


def engine_core_of(llm: Any):
    """The in-process EngineCore of ``llm`` (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)."""
    core = llm.llm_engine.engine_core
    inner = getattr(core, "engine_core", None)
    if inner is None:
        raise RuntimeError("the engine runs in another process (multiprocessing on)")
    return inner


def model_runner_of(llm: Any):
    """The model runner of an in-process engine with one worker."""
    return engine_core_of(llm).model_executor.driver_worker.worker.model_runner


def scheduler_of(llm: Any):
    return engine_core_of(llm).scheduler


def kv_blocks_in_use(llm: Any) -> int:
    """KV blocks held by requests (cached-but-free blocks are not in use)."""
    pool = scheduler_of(llm).kv_cache_manager.block_pool
    return pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()
