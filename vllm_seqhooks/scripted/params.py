"""Requests that carry a script: :func:`scripted_params` builds their
``SamplingParams``, :func:`encode_script` their token ids from text."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from vllm import SamplingParams

from vllm_seqhooks.scripted.protocol import (
    CHILD_DEFAULT_SCRIPT_KEY,
    CHILD_SCRIPT_END_KEY,
    CHILD_SCRIPTS_KEY,
    EOS_TOKEN_ID_KEY,
    SAMPLED_BEFORE_KEY,
    SCRIPT_END_KEY,
    SCRIPT_ENDS,
    SCRIPT_KEY,
    validate_script_args,
)

def scripted_params(
    script: Sequence[int] | None,
    *,
    child_scripts: Mapping[str, Sequence[int]] | None = None,
    end: str = "eos",
    child_end: str | None = None,
    child_default_script: Sequence[int] | None = None,
    eos_token_id: int | None = None,
    sampled_before: int | None = None,
    **sampling_kwargs: Any,
) -> SamplingParams:
    """Build ``SamplingParams`` whose ``extra_args`` carry a script.

    ``script=None`` leaves the top-level request free (only children are
    scripted).  ``eos_token_id`` (default: the engine's EOS) is put in
    ``extra_args`` and, so that the request stops on it, in
    ``stop_token_ids``.  ``sampling_kwargs`` go to ``SamplingParams``;
    ``temperature`` defaults to 0 and, when ``end="eos"``, ``max_tokens`` to
    ``None`` (up to the model length: the script ends the request).  An
    ``extra_args`` kwarg is merged under the script keys.
    """
    if end not in SCRIPT_ENDS:
        raise ValueError(f"end must be one of {SCRIPT_ENDS}, got {end!r}")
    if child_end is not None and child_end not in SCRIPT_ENDS:
        raise ValueError(f"child_end must be one of {SCRIPT_ENDS}, got {child_end!r}")
    extra: dict[str, Any] = dict(sampling_kwargs.pop("extra_args", None) or {})
    if script is not None:
        extra[SCRIPT_KEY] = [int(t) for t in script]
    extra[SCRIPT_END_KEY] = end
    if child_scripts is not None:
        extra[CHILD_SCRIPTS_KEY] = {
            str(k): [int(t) for t in v] for k, v in child_scripts.items()
        }
    if child_end is not None:
        extra[CHILD_SCRIPT_END_KEY] = child_end
    if child_default_script is not None:
        extra[CHILD_DEFAULT_SCRIPT_KEY] = [int(t) for t in child_default_script]
    if eos_token_id is not None:
        extra[EOS_TOKEN_ID_KEY] = int(eos_token_id)
        stop = list(sampling_kwargs.pop("stop_token_ids", None) or [])
        if eos_token_id not in stop:
            stop.append(int(eos_token_id))
        sampling_kwargs["stop_token_ids"] = stop
    if sampled_before is not None:
        extra[SAMPLED_BEFORE_KEY] = int(sampled_before)
    validate_script_args(extra)
    sampling_kwargs.setdefault("temperature", 0.0)
    if end == "eos":
        sampling_kwargs.setdefault("max_tokens", None)
    return SamplingParams(extra_args=extra, **sampling_kwargs)


def encode_script(tokenizer: Any, text_or_ids: str | Sequence[int]) -> list[int]:
    """Token ids of ``text_or_ids`` with the hook and special tokens atomic.

    ``tokenizer`` is a Hugging Face tokenizer (or anything with ``encode`` and
    ``convert_tokens_to_ids``) or a model directory to load one from.  A list
    of ids is returned as a list.  The text is split on ``<promise>``,
    ``</promise>``, ``<sync>``, ``<s>``, ``</s>``, ``<pad>`` and ``<unk>``; each
    of those becomes its single id, the pieces between are encoded without
    special tokens (no BOS).
    """
    if not isinstance(text_or_ids, str):
        return [int(t) for t in text_or_ids]
    if isinstance(tokenizer, (str, bytes)) or hasattr(tokenizer, "__fspath__"):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
    from vllm_seqhooks.scripted.tiny_model import FIXED_TOKENS

    pattern = "(" + "|".join(re.escape(t) for t in FIXED_TOKENS) + ")"
    ids: list[int] = []
    for piece in re.split(pattern, text_or_ids):
        if not piece:
            continue
        if piece in FIXED_TOKENS:
            tid = tokenizer.convert_tokens_to_ids(piece)
            if tid is None or (
                tid == getattr(tokenizer, "unk_token_id", None) and piece != "<unk>"
            ):
                raise ValueError(f"the tokenizer has no token {piece!r}")
            ids.append(int(tid))
        else:
            ids.extend(tokenizer.encode(piece, add_special_tokens=False))
    return ids
