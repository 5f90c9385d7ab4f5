"""Offline testing tools: a tiny random Llama model, a token-forcing
logits processor (``scripted`` for vLLM's V1 model runner, ``scripted_v2``
for Model Runner V2) and ``v2_runner``, which runs Model Runner V2 on CPU.

``vllm_seqhooks.testing.tiny_model`` imports neither vLLM nor torch at import
time; ``vllm_seqhooks.testing.scripted`` imports vLLM.  The names below are
re-exported lazily (importing this package imports neither submodule), so
``from vllm_seqhooks.testing import build_tiny_model`` does not import vLLM,
and ``python -m vllm_seqhooks.testing.tiny_model`` runs cleanly.
"""

from __future__ import annotations

import importlib
from typing import Any

_TINY_MODEL_NAMES = (
    "BOS_ID",
    "BOS_TOKEN",
    "EOS_ID",
    "EOS_TOKEN",
    "FIXED_TOKENS",
    "HOOK_TOKEN_IDS",
    "HOOK_TOKENS",
    "PAD_ID",
    "PAD_TOKEN",
    "PROMISE_END_ID",
    "PROMISE_END_TOKEN",
    "PROMISE_ID",
    "PROMISE_TOKEN",
    "SYNC_ID",
    "SYNC_TOKEN",
    "TOKENIZER_SIZE",
    "UNK_ID",
    "UNK_TOKEN",
    "VOCAB_SIZE",
    "build_tiny_model",
)
_SCRIPTED_NAMES = (
    "SCRIPTED_LOGITS_PROCESSOR_FQCN",
    "SCRIPTED_LOGITS_PROCESSOR_V2_FQCN",
    "ScriptedTokensLogitsProcessor",
    "encode_script",
    "resolve_script",
    "scripted_params",
)
_FORKJOIN_NAMES = ("scripted_processor_for",)


def __getattr__(name: str) -> Any:
    if name in _TINY_MODEL_NAMES:
        module = importlib.import_module("vllm_seqhooks.testing.tiny_model")
    elif name in _SCRIPTED_NAMES:
        module = importlib.import_module("vllm_seqhooks.testing.scripted")
    elif name in _FORKJOIN_NAMES:
        module = importlib.import_module("vllm_seqhooks.testing.forkjoin")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(module, name)


__all__ = [*_TINY_MODEL_NAMES, *_SCRIPTED_NAMES, *_FORKJOIN_NAMES]
