"""The scripted-token logits processor for vLLM's Model Runner V2.

:class:`ScriptedTokensLogitsProcessorV2` implements V2's interface
(``vllm.v1.worker.gpu.sample.logits_processor.LogitsProcessor``) with the
behaviour of the V1 class, :class:`vllm_seqhooks.scripted.processor.
ScriptedTokensLogitsProcessor`: same ``extra_args`` keys, same rules (both
read them through :func:`vllm_seqhooks.scripted.processor.forcing_plan`); see
that module's docstring.  Use it where vLLM runs Model Runner V2 (the GPU
default; on CPU see ``tests/support/v2_runner.py`` in the repository)::

    LLM(model=path, logits_processors=[ScriptedTokensLogitsProcessorV2])
    vllm serve DIR --logits-processors \\
        vllm_seqhooks.scripted.processor_v2:ScriptedTokensLogitsProcessorV2

How V2 differs, and what the class does about it:

* No output list.  V2 keeps no per-request output list for processors and
  reorders its logits rows every step; under speculative decoding a request
  owns one row per draft token.  So the index of the token a row samples is
  computed per row: ``k = sampled_before + (pos + 1 - prompt_len)``, where
  ``pos`` is the position of the row's input token (``LogitsContext.pos``;
  the sampled token goes at ``pos + 1``) and ``prompt_len`` the request's
  prompt length when its slot was last filled (``add_request``).  A request
  resumed after preemption comes back with the same prompt and its output so
  far as prefill, so k keeps counting; the fork/join scheduler re-adds a
  parent after a join with the merged context as a longer prompt and
  ``seqhooks_sampled_before`` in ``extra_args``, so k restarts from there.
  Rows before the end of the prompt (a chunked prefill) give ``k < 0`` and
  are left alone. After a splice join a request's positions run behind its
  token indices by ``seqhooks_position_shift`` (in ``extra_args``), which
  ``k`` takes back out.
* Slots, not rows.  Per-request state is kept per persistent slot
  (``req_idx``), fully rewritten by every ``add_request``.  The scripts live
  in small per-slot device tensors rebuilt in ``apply_staged_writes`` after a
  step that added requests; ``apply`` looks up each row's slot
  (``LogitsContext.expanded_idx_mapping``) and forces with tensor ops only,
  so it does not synchronize with the device.
* Order.  V2 runs custom processors after logit bias, penalties, bad words
  and the grammar mask, and before temperature, min_p and top-k/top-p: a
  forced token wins over all of these (as on V1).  A script that contradicts
  a grammar re-enables a token the grammar masked: this is a test tool.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np
import torch

from vllm.logger import init_logger
from vllm.v1.worker.gpu.sample.logits_processor.interface import (
    LogitsContext,
    LogitsProcessor,
    LogitsProcRequestState,
)

from vllm_seqhooks.config.request_keys import POSITION_SHIFT_ARG
from vllm_seqhooks.scripted.protocol import (
    ForcingPlan,
    forcing_plan,
    model_eos_token_id,
    validate_script_args,
)

if TYPE_CHECKING:
    from vllm import SamplingParams
    from vllm.config import VllmConfig

logger = init_logger(__name__)

#: Marks "nothing to force" in the device tables.
_NONE = -1


class _DeviceTables:
    """Per-slot forcing tables on the device, indexed by request slot."""

    def __init__(
        self,
        plans: list[ForcingPlan | None],
        base: np.ndarray,
        vocab_size: int,
        device: torch.device,
    ) -> None:
        width = max((len(p.script) for p in plans if p is not None), default=0)
        width = max(width, 1)
        table = np.full((len(plans), width), _NONE, dtype=np.int64)
        length = np.zeros(len(plans), dtype=np.int64)
        end = np.full(len(plans), _NONE, dtype=np.int64)
        active = np.zeros(len(plans), dtype=bool)
        for slot, plan in enumerate(plans):
            if plan is None:
                continue
            active[slot] = True
            length[slot] = len(plan.script)
            table[slot, : len(plan.script)] = plan.script
            if plan.end_token is not None:
                end[slot] = plan.end_token
        # Out-of-vocabulary tokens are not forced (add_request warned).
        table[table >= vocab_size] = _NONE
        end[end >= vocab_size] = _NONE

        def put(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(a).to(device)

        self.width = width
        self.table = put(table)
        self.length = put(length)
        self.end = put(end)
        self.active = put(active)
        self.base = put(base.copy())


class ScriptedTokensLogitsProcessorV2(LogitsProcessor):
    """Forces per-request token scripts on Model Runner V2; see the module
    docstring."""

    def __init__(
        self, vllm_config: VllmConfig | None, req_states: LogitsProcRequestState
    ) -> None:
        self.req_states = req_states
        self.device = req_states.device
        self.vocab_size = req_states.vocab_size
        self.default_eos_token_id = model_eos_token_id(vllm_config)
        n = req_states.max_num_reqs
        # Host state per request slot: the source of truth.
        self.plans: list[ForcingPlan | None] = [None] * n
        # k = base[slot] + pos + 1, base = sampled_before - prompt_len.
        self._base = np.zeros(n, dtype=np.int64)
        self._scripted = np.zeros(n, dtype=bool)
        self._delay_s = np.zeros(n, dtype=np.float64)
        self._tables: _DeviceTables | None = None
        self._stale = True
        self._warned_out_of_range = False

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        validate_script_args(sampling_params.extra_args)

    def add_request(self, req_idx: int, sampling_params: SamplingParams) -> bool:
        plan = forcing_plan(sampling_params, self.default_eos_token_id)
        self.plans[req_idx] = plan
        self._scripted[req_idx] = plan is not None
        self._delay_s[req_idx] = plan.delay_s if plan is not None else 0.0
        if plan is not None:
            # The model runner fills req_states before the sampler's add.
            prompt_len = int(self.req_states.prompt_len.np[req_idx])
            # After a splice join positions run behind token indices.
            shift = int((sampling_params.extra_args or {}).get(POSITION_SHIFT_ARG, 0))
            self._base[req_idx] = plan.sampled_before - prompt_len - shift
            self._warn_out_of_range(plan)
        self._stale = True
        return plan is not None

    def _warn_out_of_range(self, plan: ForcingPlan) -> None:
        tokens = [*plan.script, *([] if plan.end_token is None else [plan.end_token])]
        bad = [t for t in tokens if t >= self.vocab_size]
        if bad and not self._warned_out_of_range:
            self._warned_out_of_range = True
            logger.warning(
                "Scripted token id %d is out of the vocabulary (%d); not forcing it.",
                bad[0],
                self.vocab_size,
            )

    def apply_staged_writes(self) -> None:
        if self._stale:
            self._tables = _DeviceTables(
                self.plans, self._base, self.vocab_size, self.device
            )
            self._stale = False

    def apply(self, logits: torch.Tensor, ctx: LogitsContext) -> torch.Tensor:
        slots_np = ctx.idx_mapping_np
        if not self._scripted[slots_np].any():
            return logits
        delay_s = float(self._delay_s[slots_np].max())
        if delay_s:
            time.sleep(delay_s)
        # The model runner flushes after adding requests; this covers callers
        # that do not (a no-op otherwise).
        self.apply_staged_writes()
        t = self._tables
        assert t is not None
        slots = ctx.expanded_idx_mapping.long()
        k = t.base[slots] + ctx.pos.long() + 1
        in_script = (k >= 0) & (k < t.length[slots])
        scripted = t.table[slots, k.clamp(0, t.width - 1)]
        token = torch.where(in_script, scripted, t.end[slots])
        force = t.active[slots] & (k >= 0) & (token != _NONE)
        vocab_ids = torch.arange(logits.shape[-1], device=logits.device)
        hit = vocab_ids.unsqueeze(0) == token.unsqueeze(1)
        rows = force.unsqueeze(1)
        logits.masked_fill_(rows & ~hit, float("-inf"))
        logits.masked_fill_(rows & hit, 0.0)
        return logits


__all__ = ["ScriptedTokensLogitsProcessorV2"]
