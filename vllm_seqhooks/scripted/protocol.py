"""The scripted-token protocol (see :mod:`vllm_seqhooks.scripted.processor`):
the ``extra_args`` keys, their validation, and the :class:`ForcingPlan`
both model runners' processors follow. Imports vLLM only for types."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm.logger import init_logger

from vllm_seqhooks.config.request_keys import register_request_keys
from vllm_seqhooks.config.request_keys import CHILD_KEY_ARG, SAMPLED_BEFORE_ARG

if TYPE_CHECKING:
    from vllm import SamplingParams
    from vllm.config import VllmConfig

logger = init_logger("vllm_seqhooks.scripted.processor")

SCRIPT_KEY = "seqhooks_script"
SAMPLED_BEFORE_KEY = SAMPLED_BEFORE_ARG
SCRIPT_END_KEY = "seqhooks_script_end"
EOS_TOKEN_ID_KEY = "seqhooks_eos_token_id"
CHILD_KEY = CHILD_KEY_ARG
CHILD_SCRIPTS_KEY = "seqhooks_child_scripts"
CHILD_SCRIPT_END_KEY = "seqhooks_child_script_end"
CHILD_DEFAULT_SCRIPT_KEY = "seqhooks_child_default_script"
STEP_DELAY_KEY = "seqhooks_step_delay_ms"

SCRIPT_ENDS = ("free", "eos")

# Requests to an engine with hooks may carry these keys (its validation
# refuses unknown seqhooks_* keys as typos).
register_request_keys(SCRIPT_KEY, SCRIPT_END_KEY, EOS_TOKEN_ID_KEY, CHILD_SCRIPTS_KEY,
                      CHILD_SCRIPT_END_KEY, CHILD_DEFAULT_SCRIPT_KEY, STEP_DELAY_KEY)

#: The ``<module>:<qualname>`` string vLLM accepts (``--logits-processors``),
#: V1 model runner.
SCRIPTED_LOGITS_PROCESSOR_FQCN = (
    "vllm_seqhooks.scripted.processor:ScriptedTokensLogitsProcessor"
)
#: The same for Model Runner V2 (:mod:`vllm_seqhooks.scripted.processor_v2`).
SCRIPTED_LOGITS_PROCESSOR_V2_FQCN = (
    "vllm_seqhooks.scripted.processor_v2:ScriptedTokensLogitsProcessorV2"
)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_script(name: str, value: Any) -> None:
    if not isinstance(value, (list, tuple)) or not all(
        _is_int(t) and t >= 0 for t in value
    ):
        raise ValueError(
            f"extra_args[{name!r}] must be a list of token ids (ints >= 0), "
            f"got {value!r}"
        )


def _child_scripts(extra_args: Mapping[str, Any]) -> Any:
    scripts = extra_args.get(CHILD_SCRIPTS_KEY)
    if isinstance(scripts, str):
        # The OpenAI server's ``vllm_xargs`` holds no nested dicts: accept the
        # dict as a JSON string.
        try:
            scripts = json.loads(scripts)
        except ValueError as e:
            raise ValueError(
                f"extra_args[{CHILD_SCRIPTS_KEY!r}] is a string but not JSON: {e}"
            ) from None
    return scripts


def validate_script_args(extra_args: Mapping[str, Any] | None) -> None:
    """Raise ``ValueError`` naming the key when a ``seqhooks_*`` key is bad."""
    if not extra_args:
        return
    if SCRIPT_KEY in extra_args:
        _check_script(SCRIPT_KEY, extra_args[SCRIPT_KEY])
    if CHILD_DEFAULT_SCRIPT_KEY in extra_args:
        _check_script(CHILD_DEFAULT_SCRIPT_KEY, extra_args[CHILD_DEFAULT_SCRIPT_KEY])
    if CHILD_SCRIPTS_KEY in extra_args:
        scripts = _child_scripts(extra_args)
        if not isinstance(scripts, Mapping):
            raise ValueError(
                f"extra_args[{CHILD_SCRIPTS_KEY!r}] must be a dict "
                f"child key -> list of token ids, got {scripts!r}"
            )
        for key, script in scripts.items():
            if not isinstance(key, str):
                raise ValueError(
                    f"extra_args[{CHILD_SCRIPTS_KEY!r}] keys must be strings "
                    f"like '0' or '0.1', got {key!r}"
                )
            _check_script(f"{CHILD_SCRIPTS_KEY}[{key!r}]", script)
    for key in (SCRIPT_END_KEY, CHILD_SCRIPT_END_KEY):
        if key in extra_args and extra_args[key] not in SCRIPT_ENDS:
            raise ValueError(
                f"extra_args[{key!r}] must be one of {SCRIPT_ENDS}, "
                f"got {extra_args[key]!r}"
            )
    if SAMPLED_BEFORE_KEY in extra_args:
        v = extra_args[SAMPLED_BEFORE_KEY]
        if not _is_int(v) or v < 0:
            raise ValueError(
                f"extra_args[{SAMPLED_BEFORE_KEY!r}] must be an int >= 0, got {v!r}"
            )
    if EOS_TOKEN_ID_KEY in extra_args:
        v = extra_args[EOS_TOKEN_ID_KEY]
        if not _is_int(v) or v < 0:
            raise ValueError(
                f"extra_args[{EOS_TOKEN_ID_KEY!r}] must be a token id, got {v!r}"
            )
    if STEP_DELAY_KEY in extra_args:
        v = extra_args[STEP_DELAY_KEY]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
            raise ValueError(
                f"extra_args[{STEP_DELAY_KEY!r}] must be a number of milliseconds "
                f">= 0, got {v!r}"
            )
    if CHILD_KEY in extra_args and not isinstance(extra_args[CHILD_KEY], str):
        raise ValueError(
            f"extra_args[{CHILD_KEY!r}] must be a string, got {extra_args[CHILD_KEY]!r}"
        )


def resolve_script(
    extra_args: Mapping[str, Any] | None,
) -> tuple[list[int], int, str] | None:
    """Return ``(script, sampled_before, end)`` for a request, or ``None``.

    ``None`` means the request is not scripted (it is left alone).  Pure
    function of ``extra_args``; the processor and tests share it.
    """
    if not extra_args:
        return None
    end = extra_args.get(SCRIPT_END_KEY, "free")
    child_key = extra_args.get(CHILD_KEY)
    if child_key is None:
        script = extra_args.get(SCRIPT_KEY)
    else:
        script = (_child_scripts(extra_args) or {}).get(str(child_key))
        if script is None:
            script = extra_args.get(CHILD_DEFAULT_SCRIPT_KEY)
        end = extra_args.get(CHILD_SCRIPT_END_KEY, end)
    if script is None:
        return None
    return list(script), int(extra_args.get(SAMPLED_BEFORE_KEY, 0) or 0), end


def model_eos_token_id(vllm_config: VllmConfig | None) -> int | None:
    """The ``eos_token_id`` of the model's ``config.json`` (first of a list)."""
    try:
        eos = vllm_config.model_config.hf_text_config.eos_token_id
    except AttributeError:
        return None
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    return eos if _is_int(eos) else None


@dataclass(frozen=True)
class ForcingPlan:
    """What to force for one request, whichever model-runner interface asks.

    ``token_at(k)`` is the token forced as the request's k-th sampled token
    (counting from its first sampled token, ``sampled_before`` included), or
    ``None`` to leave the logits alone.
    """

    script: tuple[int, ...]
    sampled_before: int
    end_token: int | None
    delay_s: float = 0.0

    def token_at(self, k: int) -> int | None:
        if k < 0:
            return None
        if k < len(self.script):
            return self.script[k]
        return self.end_token


def forcing_plan(
    params: SamplingParams, default_eos_token_id: int | None = None
) -> ForcingPlan | None:
    """The :class:`ForcingPlan` of a request, or ``None`` when it is not forced.

    ``default_eos_token_id`` (the model's, see :func:`model_eos_token_id`) is
    the last resort for ``seqhooks_script_end="eos"``.
    """
    resolved = resolve_script(params.extra_args)
    if resolved is None:
        return None
    script, sampled_before, end = resolved
    end_token = None
    if end == "eos":
        end_token = params.extra_args.get(EOS_TOKEN_ID_KEY)
        if end_token is None:
            end_token = params.eos_token_id
        if end_token is None:
            end_token = default_eos_token_id
        if end_token is None:
            logger.warning(
                "seqhooks_script_end='eos' but no EOS token id is known; "
                "set extra_args[%r]. Not forcing after the script.",
                EOS_TOKEN_ID_KEY,
            )
    if not script and end_token is None:
        return None
    delay_s = float(params.extra_args.get(STEP_DELAY_KEY, 0) or 0) / 1000
    return ForcingPlan(tuple(script), sampled_before, end_token, delay_s)
