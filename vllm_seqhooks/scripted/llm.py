"""Fork/join on the tiny model with scripted hook tokens: a
``vllm_seqhooks.LLM`` with the scripted-token logits processor for the model
runner vLLM picks, and scripts written as text (imports vLLM).  Used by
``python -m vllm_seqhooks --scripted``, the install check and the tests."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from vllm_seqhooks.scripted.processor import (
    ScriptedTokensLogitsProcessor,
    encode_script,
    scripted_params,
)
from vllm_seqhooks.scripted.tiny_model import (
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
    :func:`vllm_seqhooks.scripted.runner_choice.uses_v2_model_runner`).
    """
    if not isinstance(use_v2, bool):
        use_v2 = use_v2.use_v2_model_runner
    if use_v2:
        from vllm_seqhooks.scripted.processor_v2 import ScriptedTokensLogitsProcessorV2

        return ScriptedTokensLogitsProcessorV2
    return ScriptedTokensLogitsProcessor


def scripted_engine_kwargs(model: str, **engine_kwargs: Any) -> dict[str, Any]:
    """Engine keyword arguments for the tiny model: ``TINY_ENGINE_KWARGS``
    updated with ``engine_kwargs``, plus the scripted-token logits processor
    for the model runner vLLM will use (V1 or V2, see
    :func:`vllm_seqhooks.scripted.runner_choice.uses_v2_model_runner`) unless
    ``logits_processors`` is given."""
    from vllm_seqhooks.scripted.runner_choice import uses_v2_model_runner

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
