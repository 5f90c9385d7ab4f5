"""Force the tokens a request samples: vLLM logits processors for tests.

:class:`ScriptedTokensLogitsProcessor` (V1 model runner) and its Model Runner
V2 twin (see the end of this docstring) read each request's
``SamplingParams.extra_args``:

``seqhooks_script`` (list of int)
    The k-th token sampled by the request is forced to ``script[k]`` (every
    other logit is set to ``-inf``, the forced one to 0), where k is
    ``seqhooks_sampled_before`` plus the number of tokens sampled since the
    request was last added to the model runner (the length of its output
    list on V1; on V2, the position being sampled minus the prompt length of
    that add).
``seqhooks_sampled_before`` (int, default 0)
    Tokens the request sampled before its current output list began.  The
    fork/join scheduler re-adds a parent to the worker after a join with a
    fresh output list (the merged context becomes its prompt) and a copy of
    its ``extra_args`` carrying this key;
    the processor re-reads the params on every "added" entry, so the new
    value is used from then on.
``seqhooks_script_end`` (``"free"`` (default) or ``"eos"``)
    What happens once ``k >= len(script)``: ``"free"`` stops forcing (the
    model samples as usual), ``"eos"`` forces the end-of-sequence token.
``seqhooks_eos_token_id`` (int)
    The token forced by ``"eos"``.  Without it the processor uses the
    request's own EOS (``SamplingParams.eos_token_id``, which the engine sets
    from the tokenizer), then the ``eos_token_id`` of the model's
    ``config.json``; when none is known, the end behaves like ``"free"``.
    Use the key when the token to force is not the model's EOS (and add it to
    ``stop_token_ids`` so the request stops; :func:`scripted_params` does).

Child requests (created by the fork/join scheduler) carry a copy of the
parent's ``extra_args`` plus ``seqhooks_child_key``, a dotted path: ``"0"``,
``"1"``, ... for the children of the top-level request in promise order,
``"0.1"`` for the second child of child ``"0"``, and so on.  For them the
script is ``seqhooks_child_scripts[key]`` (a dict ``str -> list[int]``); when
there is no entry, ``seqhooks_child_default_script`` if given, else the child
is not forced at all.  ``seqhooks_child_script_end``, if present, overrides
``seqhooks_script_end`` for children.

``seqhooks_step_delay_ms`` (number >= 0)
    A slow model: every step whose batch holds a scripted request with this
    key sleeps that long (the largest value in the batch) in :meth:`apply`.
    Children inherit it with the rest of ``extra_args``. Tests use it to keep
    a request in a state (parked, children running) for seconds whatever the
    machine's speed.

A request with none of these keys is untouched, and when no request of the
batch has a script :meth:`ScriptedTokensLogitsProcessor.apply` returns at
once.  A forced token wins over what runs before it (``allowed_token_ids``,
bad words, structured-output masks, ``min_tokens``, ``logit_bias``); penalties
and temperature, applied after, cannot change it.  The
reported logprobs are those of the model (vLLM's default ``raw_logprobs``
mode computes them before logits processors).

Use::

    from vllm import LLM
    from vllm_seqhooks.testing.scripted import (
        ScriptedTokensLogitsProcessor, scripted_params)

    llm = LLM(model=path, logits_processors=[ScriptedTokensLogitsProcessor])
    # or logits_processors=[SCRIPTED_LOGITS_PROCESSOR_FQCN]
    out = llm.generate("hi", scripted_params([40, 41, 42]))

and for the server (the package must be importable by the ``vllm`` command,
e.g. installed or on ``PYTHONPATH``)::

    vllm serve DIR --logits-processors \\
        vllm_seqhooks.testing.scripted:ScriptedTokensLogitsProcessor

with the keys above sent in the request body's ``vllm_xargs`` (the OpenAI
server copies ``vllm_xargs`` into ``SamplingParams.extra_args``; with the
OpenAI client: ``extra_body={"vllm_xargs": {...}}``).  ``vllm_xargs`` values
may only be scalars or flat lists, so there ``seqhooks_child_scripts`` is
given as a JSON string (``json.dumps({"0": [...]})``), which the processor
also accepts.

Two model runners, two classes, one behaviour.  vLLM 0.32 has two logits
processor interfaces: the V1 model runner's
(``vllm.v1.sample.logits_processor``, used by the CPU backend and by GPUs with
``VLLM_USE_V2_MODEL_RUNNER=0``) takes :class:`ScriptedTokensLogitsProcessor`;
Model Runner V2's (``vllm.v1.worker.gpu.sample.logits_processor``, the GPU
default) takes
:class:`vllm_seqhooks.testing.scripted_v2.ScriptedTokensLogitsProcessorV2`
(``SCRIPTED_LOGITS_PROCESSOR_V2_FQCN``), and each runner rejects the other's
class.  :func:`scripted_processor_for` picks the class for a ``VllmConfig`` or
a flag (:func:`vllm_seqhooks.testing.v2_runner.uses_v2_model_runner` predicts
the flag from engine arguments); :func:`vllm_seqhooks.testing.forkjoin.hook_llm`
does this itself.  Both classes share :func:`forcing_plan`, so the keys above
mean the same on both; tests run V2 on CPU through
:mod:`vllm_seqhooks.testing.v2_runner`.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from vllm import SamplingParams
from vllm.logger import init_logger
from vllm.v1.sample.logits_processor import (
    BatchUpdate,
    LogitsProcessor,
    MoveDirectionality,
)

from vllm_seqhooks.config import register_request_keys
from vllm_seqhooks.dependencies import CHILD_KEY_ARG, SAMPLED_BEFORE_ARG

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = init_logger(__name__)

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
    "vllm_seqhooks.testing.scripted:ScriptedTokensLogitsProcessor"
)
#: The same for Model Runner V2 (:mod:`vllm_seqhooks.testing.scripted_v2`).
SCRIPTED_LOGITS_PROCESSOR_V2_FQCN = (
    "vllm_seqhooks.testing.scripted_v2:ScriptedTokensLogitsProcessorV2"
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


class _Scripted:
    """Per-row state: the plan and a live reference to the output ids."""

    __slots__ = ("plan", "output_ids")

    def __init__(self, plan: ForcingPlan, output_ids: Sequence[int]) -> None:
        self.plan = plan
        self.output_ids = output_ids

    @property
    def delay_s(self) -> float:
        return self.plan.delay_s

    def forced_token(self) -> int | None:
        return self.plan.token_at(self.plan.sampled_before + len(self.output_ids))


class ScriptedTokensLogitsProcessor(LogitsProcessor):
    """Forces per-request token scripts; see the module docstring."""

    def __init__(
        self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool
    ) -> None:
        self.device = device
        self.default_eos_token_id = model_eos_token_id(vllm_config)
        # persistent-batch row index -> state
        self.rows: dict[int, _Scripted] = {}
        self._warned_out_of_range = False

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        validate_script_args(sampling_params.extra_args)

    def is_argmax_invariant(self) -> bool:
        return False

    def _new_state(
        self, params: SamplingParams, output_ids: Sequence[int]
    ) -> _Scripted | None:
        plan = forcing_plan(params, self.default_eos_token_id)
        return None if plan is None else _Scripted(plan, output_ids)

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        rows = self.rows
        # Order: removed, added, moved (see BatchUpdate).
        if rows:
            for index in batch_update.removed:
                rows.pop(index, None)
        for index, params, _prompt_ids, output_ids in batch_update.added:
            state = self._new_state(params, output_ids) if params else None
            if state is None:
                rows.pop(index, None)
            else:
                rows[index] = state
        if rows:
            for a, b, direction in batch_update.moved:
                a_state = rows.pop(a, None)
                b_state = rows.pop(b, None)
                if a_state is not None:
                    rows[b] = a_state
                if b_state is not None and direction == MoveDirectionality.SWAP:
                    rows[a] = b_state

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        delay_s = max(state.delay_s for state in self.rows.values())
        if delay_s:
            time.sleep(delay_s)
        vocab = logits.shape[-1]
        row_ids: list[int] = []
        token_ids: list[int] = []
        for index, state in self.rows.items():
            tok = state.forced_token()
            if tok is None:
                continue
            if tok >= vocab:
                if not self._warned_out_of_range:
                    self._warned_out_of_range = True
                    logger.warning(
                        "Scripted token id %d is out of the vocabulary (%d); "
                        "not forcing it.",
                        tok,
                        vocab,
                    )
                continue
            row_ids.append(index)
            token_ids.append(tok)
        if not row_ids:
            return logits
        rows_t = torch.tensor(row_ids, dtype=torch.long, device=logits.device)
        toks_t = torch.tensor(token_ids, dtype=torch.long, device=logits.device)
        logits[rows_t] = float("-inf")
        logits[rows_t, toks_t] = 0.0
        return logits


def scripted_processor_for(use_v2: bool | VllmConfig) -> type:
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


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


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
    from vllm_seqhooks.testing.tiny_model import FIXED_TOKENS

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


__all__ = [
    "CHILD_DEFAULT_SCRIPT_KEY",
    "CHILD_KEY",
    "CHILD_SCRIPTS_KEY",
    "CHILD_SCRIPT_END_KEY",
    "EOS_TOKEN_ID_KEY",
    "ForcingPlan",
    "SAMPLED_BEFORE_KEY",
    "SCRIPTED_LOGITS_PROCESSOR_FQCN",
    "SCRIPTED_LOGITS_PROCESSOR_V2_FQCN",
    "SCRIPT_END_KEY",
    "SCRIPT_KEY",
    "ScriptedTokensLogitsProcessor",
    "encode_script",
    "forcing_plan",
    "model_eos_token_id",
    "resolve_script",
    "scripted_params",
    "scripted_processor_for",
    "validate_script_args",
]
