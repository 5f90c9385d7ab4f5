"""Admission-time validation of per-request hook settings.

vLLM calls ``validate_params`` of every configured logits processor for each
request as it is admitted (in the frontend): a ``ValueError`` there becomes
a ``VLLMValidationError`` for ``LLM.generate`` and an HTTP 400 for the OpenAI
server, with the message, and the engine never sees the request. This
processor changes no logits (``apply`` returns them as they are); it is
installed only when hooks are on.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor

from vllm_seqhooks.config import parse_request_overrides

QUALNAME = "vllm_seqhooks.validation:SeqHooksRequestValidator"


def check_request(sampling_params: SamplingParams) -> None:
    """Raise ``ValueError`` (naming the field) for settings hooks cannot honour."""
    overrides = parse_request_overrides(sampling_params.extra_args)
    if overrides.get("enabled", True) is False:
        return
    if sampling_params.logprobs is not None or sampling_params.prompt_logprobs is not None:
        raise ValueError(
            "logprobs/prompt_logprobs cannot be combined with sequence hooks: "
            "merged child tokens are not sampled by the parent and have no "
            "logprobs (send seqhooks_enabled=false in vllm_xargs / extra_args "
            "to turn hooks off for this request)"
        )


class SeqHooksRequestValidator(LogitsProcessor):
    """A no-op logits processor whose ``validate_params`` checks hook settings."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        pass

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        check_request(sampling_params)

    def is_argmax_invariant(self) -> bool:
        return True

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        pass

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits


def with_validator(logits_processors: list[Any] | None) -> list[Any]:
    """``logits_processors`` plus the validator (once)."""
    procs = list(logits_processors or [])
    if not any(p in (QUALNAME, SeqHooksRequestValidator) for p in procs):
        procs.append(QUALNAME)
    return procs
