"""Admission-time validation of per-request hook settings.

:func:`check_request` raises ``ValueError`` (naming the field) for a request
whose settings hooks cannot honour. It runs in the frontend, once per
request, where vLLM validates sampling parameters: a failure becomes a
``VLLMValidationError`` for ``LLM.generate`` and an HTTP 400 for the OpenAI
server, with the message, and the engine never sees the request.

It is installed by ``vllm_private.install_request_validator`` (called by
the ``vllm.general_plugins`` entry point and by ``vllm_seqhooks.LLM``) into
the frontend's ``InputProcessor``, only for engines with hooks. No logits
processor is involved: those are model-runner specific (V1 and V2 have
different interfaces), make vLLM refuse speculative decoding, and, on the V1
runner, cost a device-to-host copy every step.
"""

from __future__ import annotations

from typing import Any, Callable

from vllm_seqhooks.config.field_checks import unknown_fields_message
from vllm_seqhooks.config.special_kwargs import ADDITIONAL_CONFIG_KEY
from vllm_seqhooks.config.request_keys import (
    ENGINE_REQUEST_KEYS,
    REQUEST_OVERRIDE_KEYS,
    parse_request_overrides,
    unknown_request_keys,
)

BEAM_SEARCH_REFUSAL = (
    "beam search cannot be combined with sequence hooks: vLLM's beam search scores one-token "
    "requests step by step, and the children a step spawns would never be joined into its "
    "beams. Sample n completions instead (each is its own fork/join family), or serve the "
    "model without hooks for beam search")


MULTIMODAL_REFUSAL = (
    "multimodal prompts cannot be combined with sequence hooks: a child is built from its "
    "parent's token ids and would not carry the images or audio they stand for (send "
    "seqhooks_enabled=false in vllm_xargs / extra_args to turn hooks off for this request)")


def check_engine_request(request: Any, params: Any) -> None:
    """Raise ``ValueError`` for a processed request hooks cannot honour: a
    multimodal prompt with hooks on for it."""
    if not getattr(request, "mm_features", None):
        return
    extra = getattr(params, "extra_args", None)
    if parse_request_overrides(extra).get("enabled", True) is not False:
        raise ValueError(MULTIMODAL_REFUSAL)


def check_request(sampling_params: Any) -> None:
    """Raise ``ValueError`` (naming the field) for settings hooks cannot honour."""
    unknown = unknown_request_keys(sampling_params.extra_args, ENGINE_REQUEST_KEYS)
    if unknown:
        raise ValueError(unknown_fields_message(
            unknown, REQUEST_OVERRIDE_KEYS,
            what="sequence-hook request key(s) in vllm_xargs / extra_args", known_as="known keys"))
    overrides = parse_request_overrides(sampling_params.extra_args)
    if overrides.get("enabled", True) is False:
        return
    if sampling_params.prompt_logprobs is not None:
        raise ValueError(
            "prompt_logprobs cannot be combined with sequence hooks: a join's merged "
            "tokens are not a prompt the request was scored on (sample logprobs work: "
            "a child's tokens carry its logprobs; send seqhooks_enabled=false in "
            "vllm_xargs / extra_args to turn hooks off for this request)"
        )


def hooks_enabled(additional_config: Any) -> bool:
    """Whether an engine's ``additional_config`` turns hooks on."""
    return isinstance(additional_config, dict) and bool(
        additional_config.get(ADDITIONAL_CONFIG_KEY)
    )


def chain_validators(
    first: Callable[[Any], None], error_type: type[Exception]
) -> Callable[[Any], None]:
    """A params validator that runs ``first`` (vLLM's own) and then
    :func:`check_request`, whose ``ValueError`` becomes ``error_type``."""

    def validate(sampling_params: Any) -> None:
        first(sampling_params)
        try:
            check_request(sampling_params)
        except ValueError as exc:
            raise error_type(str(exc)) from exc

    validate.seqhooks = True  # type: ignore[attr-defined]
    return validate
