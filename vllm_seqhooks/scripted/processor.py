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
    from vllm_seqhooks.scripted.processor import (
        ScriptedTokensLogitsProcessor, scripted_params)

    llm = LLM(model=path, logits_processors=[ScriptedTokensLogitsProcessor])
    # or logits_processors=[SCRIPTED_LOGITS_PROCESSOR_FQCN]
    out = llm.generate("hi", scripted_params([40, 41, 42]))

and for the server (the package must be importable by the ``vllm`` command,
e.g. installed or on ``PYTHONPATH``)::

    vllm serve DIR --logits-processors \\
        vllm_seqhooks.scripted.processor:ScriptedTokensLogitsProcessor

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
:class:`vllm_seqhooks.scripted.processor_v2.ScriptedTokensLogitsProcessorV2`
(``SCRIPTED_LOGITS_PROCESSOR_V2_FQCN``), and each runner rejects the other's
class.  :func:`vllm_seqhooks.scripted.llm.scripted_processor_for` picks the class for a ``VllmConfig`` or
a flag (:func:`vllm_seqhooks.scripted.runner_choice.uses_v2_model_runner` predicts
the flag from engine arguments); :func:`vllm_seqhooks.scripted.llm.hook_llm`
does this itself.  Both classes share :func:`forcing_plan`, so the keys above
mean the same on both; tests run V2 on CPU through
``tests/support/v2_runner.py`` in the repository.

The keys, their validation and :func:`forcing_plan` live in
:mod:`.script_protocol`, the request helpers (:func:`scripted_params`,
:func:`encode_script`) in :mod:`.script_requests`; this module re-exports
both.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from vllm import SamplingParams
from vllm.logger import init_logger
from vllm.v1.sample.logits_processor import (
    BatchUpdate,
    LogitsProcessor,
    MoveDirectionality,
)

# The protocol and the request helpers, re-exported: callers import them
# from here.
from vllm_seqhooks.scripted.protocol import (  # noqa: F401
    CHILD_DEFAULT_SCRIPT_KEY,
    CHILD_KEY,
    CHILD_SCRIPT_END_KEY,
    CHILD_SCRIPTS_KEY,
    EOS_TOKEN_ID_KEY,
    SAMPLED_BEFORE_KEY,
    SCRIPT_END_KEY,
    SCRIPT_ENDS,
    SCRIPT_KEY,
    SCRIPTED_LOGITS_PROCESSOR_FQCN,
    SCRIPTED_LOGITS_PROCESSOR_V2_FQCN,
    STEP_DELAY_KEY,
    ForcingPlan,
    forcing_plan,
    model_eos_token_id,
    resolve_script,
    validate_script_args,
)
from vllm_seqhooks.scripted.params import encode_script, scripted_params  # noqa: F401

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = init_logger(__name__)

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
    "SCRIPT_ENDS",
    "SCRIPT_KEY",
    "STEP_DELAY_KEY",
    "ScriptedTokensLogitsProcessor",
    "encode_script",
    "forcing_plan",
    "model_eos_token_id",
    "resolve_script",
    "scripted_params",
    "validate_script_args",
]
