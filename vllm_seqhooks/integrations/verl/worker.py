"""The worker extension of a verl server with hooks: verl's (weight updates,
LoRA, its model patches) and ours (the worker patches,
:class:`vllm_seqhooks.engine.worker.SeqHooksWorkerExtension`). vLLM takes
one ``worker_extension_cls``; verl sets its own, so
:func:`vllm_seqhooks.integrations.verl.engine_kwargs` names this one, which
is both. Imported in vLLM's worker processes only (it imports verl)."""

from __future__ import annotations

from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension

from vllm_seqhooks.engine.worker import SeqHooksWorkerExtension


class VerlSeqHooksWorkerExtension(vLLMColocateWorkerExtension, SeqHooksWorkerExtension):
    """verl's colocate worker extension with the hook worker patches."""
