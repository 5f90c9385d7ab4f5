"""verl: an agent loop whose branching happens in the engine.

verl (0.9) runs rollouts through agent loops: an ``AgentLoopBase`` subclass,
registered by name, that sends token ids to verl's vLLM servers through its
server manager and returns an ``AgentLoopOutput``. A client loop such as
ThreadWeaver's ``ParallelBranchingController`` makes one ``generate`` call
per sequential stretch and per thread. :class:`SeqHooksAgentLoop` makes one
per sample: the engine forks, joins and merges, and the loop turns the
answer (its token ids, logprobs and hook trace) into verl's row and into
the per-call rows ThreadWeaver trains on (``expanded_*``).

The two halves:

- the agent loop, :data:`AGENT_NAME` in verl's registry, given to verl by
  ``actor_rollout_ref.rollout.agent.agent_loop_config_path`` (:data:`AGENT_LOOPS`,
  or :data:`AGENT_LOOPS_AS_SINGLE_TURN`, which puts it in place of verl's
  default ``single_turn_agent``: one line to switch; :mod:`.agent_loop`,
  which imports verl);
- the server: :func:`engine_kwargs` gives what goes under
  ``actor_rollout_ref.rollout.engine_kwargs.vllm`` (the hook scheduler, the
  model's hook settings, a worker extension that is verl's and ours).

See ``docs/rl.md`` ("verl"). This module imports neither verl nor vLLM.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

#: The agent loop's name in verl's registry.
AGENT_NAME = "seqhooks_agent"
#: verl's ``agent_loop_config_path`` that registers :data:`AGENT_NAME`.
AGENT_LOOPS = Path(__file__).with_name("agent_loops.yaml")
#: The same loop registered as ``single_turn_agent``, the agent verl runs by
#: default where the data names none: this one line switches a training run.
AGENT_LOOPS_AS_SINGLE_TURN = Path(__file__).with_name("agent_loops_as_single_turn.yaml")
#: The class the YAML files name (hydra ``_target_``).
AGENT_LOOP_CLASS_PATH = "vllm_seqhooks.integrations.verl.agent_loop.SeqHooksAgentLoop"
#: verl's worker extension with ours (``engine_kwargs`` sets it).
WORKER_EXTENSION_CLASS_PATH = "vllm_seqhooks.integrations.verl.worker.VerlSeqHooksWorkerExtension"


def engine_kwargs(special_kwargs: Any, model: Any = None,
                  additional_config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What to put under ``actor_rollout_ref.rollout.engine_kwargs.vllm``:
    verl passes these to ``vllm serve`` as flags of their own names.

    ``special_kwargs`` is what ``vllm_seqhooks.LLM`` takes (a preset name,
    ``"auto"`` with ``model``, a dict, a :class:`~vllm_seqhooks.SpecialKwargs`).
    Token strings are resolved by the engine against its tokenizer.
    ``additional_config``: one of yours to keep beside the hook settings."""
    from vllm_seqhooks.config.presets import coerce_special_kwargs
    from vllm_seqhooks.engine import SCHEDULER_CLASS_PATH

    hooks = coerce_special_kwargs(special_kwargs, model)
    if hooks is None:
        raise ValueError("engine_kwargs needs hook settings (special_kwargs), got None")
    return {
        "scheduler_cls": SCHEDULER_CLASS_PATH,
        "worker_extension_cls": WORKER_EXTENSION_CLASS_PATH,
        "additional_config": hooks.to_additional_config(additional_config),
    }

