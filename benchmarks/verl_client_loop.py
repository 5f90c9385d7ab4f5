"""ThreadWeaver's client loop as a verl agent loop, the baseline of
:mod:`benchmarks.verl_rollout` (imports verl): the loop of
``tests/support/branching_controller.py`` (ThreadWeaver's
``ParallelBranchingController`` written again), its prompt built as the
seqhooks agent loop builds it, over the agent loop's ``server_manager``.
Registered as :data:`CLIENT_LOOP_AGENT`."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register

from tests.support.branching_controller import BranchingController

CLIENT_LOOP_AGENT = "threadweaver_client_loop"


@register(CLIENT_LOOP_AGENT)
class ThreadWeaverClientAgentLoop(AgentLoopBase):
    """One ``generate`` call per sequential stretch and per thread."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        rollout = self.rollout_config
        prompt_ids = await self.ct_build_initial_tokens(list(kwargs["raw_prompt"]))

        async def generate(ids: list[int], params: dict[str, Any]) -> list[int]:
            out = await self.server_manager.generate(request_id=uuid4().hex, prompt_ids=ids,
                                                     sampling_params=dict(params))
            return out.token_ids

        controller = BranchingController(self.tokenizer, generate, sampling_params,
                                         response_length=int(rollout.response_length),
                                         max_total_tokens=int(rollout.max_model_len))
        result = await controller.run(prompt_ids)
        return AgentLoopOutput(
            prompt_ids=prompt_ids, response_ids=result.response_ids,
            response_mask=[1] * len(result.response_ids), num_turns=2, metrics={},
            extra_fields={"expanded_prompt_ids": result.expanded_prompt_ids,
                          "expanded_response_ids": result.expanded_response_ids,
                          "expanded_response_mask": result.expanded_response_mask})
