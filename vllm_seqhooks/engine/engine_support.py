"""Engines hooks refuse to run on, and why (checked at start-up)."""

from __future__ import annotations


def unsupported_engine(vllm_config, kv_cache_config=None) -> str | None:
    """Why hooks cannot run on this engine (None when they can).

    * State that is not attention KV (Mamba, linear attention, hybrids):
      a parked parent resumes from its KV frontier, but recurrent state is
      updated in place by every token the model saw, including the step
      already in flight after ``<sync>`` under async scheduling and the
      drafts cut after it, and it cannot be rolled back to the frontier.
    * KV connectors (``kv_transfer_config``): vLLM tells a connector that a
      request finished when it stops, and a parked parent stops at
      ``<sync>`` to resume later; the connector would offload or hand off,
      and free, the KV of a request that is still alive.
    """
    model_config = vllm_config.model_config
    if vllm_config.kv_transfer_config is not None:
        return ("sequence hooks cannot be combined with kv_transfer_config (KV "
                "connectors treat a parent parked at <sync> as finished); start the "
                "engine without --kv-transfer-config, or without hook flags")
    stateful = [
        what for what, flag in (("hybrid", "is_hybrid"), ("recurrent-state", "has_inner_state"),
                                ("attention-free", "is_attention_free"))
        if getattr(model_config, flag, False)
    ]
    if kv_cache_config is not None:
        for group in kv_cache_config.kv_cache_groups:
            if not _is_attention_spec(group.kv_cache_spec):
                stateful.append(type(group.kv_cache_spec).__name__)
    if stateful:
        return (f"sequence hooks need a model whose only per-token state is attention "
                f"KV; {model_config.model} has {', '.join(dict.fromkeys(stateful))} "
                "state (Mamba / linear attention), which a request parked at <sync> "
                "cannot roll back to its resume point; serve it without hook flags")
    return None


def unsupported_splice(vllm_config, kv_cache_config=None) -> str | None:
    """Why this engine cannot join by splice (None when it can).

    * Speculative decoding: a drafter computes its own positions and slots
      from the target's; a spliced request's positions run behind its
      indices.
    * M-RoPE (multimodal positions): its positions are not the runner's 1-D
      positions that a splice shifts.
    * Several KV cache groups (sliding-window or other mixed layers): a
      splice copies a path's KV within one group's blocks.
    """
    if vllm_config.speculative_config is not None:
        return ("join='splice' cannot be combined with speculative decoding (a drafter "
                "derives its positions and KV slots from the target's token indices); "
                "use join='reprefill' or no --speculative-config")
    if getattr(vllm_config.model_config, "uses_mrope", False):
        return (f"join='splice' needs 1-D rotary positions; {vllm_config.model_config.model} "
                "uses M-RoPE; use join='reprefill'")
    if kv_cache_config is not None and len(kv_cache_config.kv_cache_groups) > 1:
        return ("join='splice' needs one KV cache group (every layer alike); this model has "
                f"{len(kv_cache_config.kv_cache_groups)}; use join='reprefill'")
    return None


def _is_attention_spec(spec) -> bool:
    from vllm.v1.kv_cache_interface import AttentionSpec, UniformTypeKVCacheSpecs

    if isinstance(spec, UniformTypeKVCacheSpecs):
        return all(_is_attention_spec(s) for s in spec.kv_cache_specs.values())
    return isinstance(spec, AttentionSpec)
