"""The agent loop itself: a verl ``AgentLoopBase`` (imports verl).

Follows verl 0.9.1's ``SingleTurnAgentLoop.run``
(``verl/experimental/agent_loop/single_turn_agent_loop.py``): the prompt
from the sample's ``raw_prompt`` messages through verl's own Continuous
Token builder, one ``server_manager.generate`` call, an ``AgentLoopOutput``.
The difference is the call's answer: a hook engine forked and joined inside
it, so the rows come from its hook trace (:mod:`.rows`). ThreadWeaver's
fork of verl declares ``expanded_*`` fields on ``AgentLoopOutput``: they
are set there when the class has them, else they go in ``extra_fields``
(verl carries those into the batch's ``non_tensor_batch``).
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

try:
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register
    from verl.utils.profiler import simple_timer
except ImportError as exc:  # (say how to get it, not only what is missing)
    raise ImportError(f"the seqhooks agent loop subclasses verl's AgentLoopBase: {exc}; "
                      "docs/rl.md ('verl') says how to install verl beside vLLM") from exc

from vllm_seqhooks.integrations.verl import AGENT_NAME
from vllm_seqhooks.integrations.verl.rows import agent_loop_fields


@register(AGENT_NAME)
class SeqHooksAgentLoop(AgentLoopBase):
    """One token-in request per sample to a server with hooks; the engine
    branches. Text prompts only (a multimodal sample is refused by verl's
    own check)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.response_length = int(self.rollout_config.response_length)
        max_model_len = self.rollout_config.get("max_model_len", None)
        self.max_total_tokens = (int(max_model_len) if max_model_len is not None
                                 else int(self.rollout_config.prompt_length) + self.response_length)

    async def run(self, sampling_params: dict[str, Any], priority: int = 0,
                  **kwargs: Any) -> AgentLoopOutput:
        messages = list(kwargs["raw_prompt"])
        multi_modal_data = await self.process_multi_modal_info(messages)
        self._assert_mm_supported(bool(multi_modal_data))
        prompt_ids = await self.ct_build_initial_tokens(messages)
        metrics: dict[str, Any] = {}
        with simple_timer("generate_sequences", metrics):
            output = await self.server_manager.generate(
                request_id=uuid4().hex, prompt_ids=prompt_ids,
                sampling_params=dict(sampling_params), priority=int(priority))
        metrics["num_preempted"] = (output.num_preempted if output.num_preempted is not None
                                    else -1)
        fields = agent_loop_fields(prompt_ids, output.token_ids, output.log_probs,
                                   output.extra_fields, response_length=self.response_length,
                                   max_total_tokens=self.max_total_tokens)
        expanded = fields.pop("extra_fields")
        extra = dict(output.extra_fields)
        extra.pop("kv_transfer_params", None)  # (the trace: read, and large)
        extra["stop_reason"] = output.stop_reason
        declared = AgentLoopOutput.model_fields
        on_output = {k: v for k, v in expanded.items() if k in declared}
        extra.update({k: v for k, v in expanded.items() if k not in declared})
        return AgentLoopOutput(**fields, **on_output, multi_modal_data={}, num_turns=2,
                               metrics=metrics, extra_fields=extra)
