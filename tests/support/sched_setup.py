"""Build a vLLM V1 scheduler offline, with no model, tokenizer or weights
(for the surgical tests of :mod:`tests.support.sched_harness`, and
the tests that only need a scheduler or a ``VllmConfig``).

:func:`make_vllm_config` writes a tiny Llama ``config.json`` to a temporary
directory and builds the configuration (hooks, async scheduling, ngram
speculative decoding, the scheduling policy as asked); :func:`make_scheduler`
builds ``SeqHooksScheduler`` or vLLM's own scheduler on it with a one-group
full-attention KV cache; :func:`make_request` builds a ``Request`` as the
frontend would. Token ids are the tiny model's
(:mod:`vllm_seqhooks.scripted.tiny_model`). Importing this module imports no
vLLM; its functions do.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Sequence

from vllm_seqhooks.config.special_kwargs import SpecialKwargs
from vllm_seqhooks.scripted.tiny_model import (
    EOS_ID,
    PROMISE_END_ID,
    PROMISE_ID,
    SYNC_ID,
)

#: Merge separator used by default (the tiny tokenizer's "\n").
SEP_ID = 8
#: Marker tokens used as ``failed_child_marker_token_ids`` in tests.
FAILED_MARKER_IDS = (90, 91)
#: Vocabulary of the fake model (the tiny model's padded vocab).
VOCAB = 128

_MODEL_DIR: str | None = None
_HASH_READY = False


def tiny_model_dir() -> str:
    """A directory holding only a tiny Llama ``config.json`` (per process)."""
    global _MODEL_DIR
    if _MODEL_DIR is None or not os.path.isdir(_MODEL_DIR):
        d = tempfile.mkdtemp(prefix="seqhooks_sched_harness_")
        cfg = {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "vocab_size": VOCAB,
            "max_position_embeddings": 4096,
            "bos_token_id": 1,
            "eos_token_id": EOS_ID,
            "rms_norm_eps": 1e-5,
            "torch_dtype": "float32",
            "tie_word_embeddings": False,
        }
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        # The tiny model's character tokenizer, for tag formats (the
        # scheduler reads tags through it).
        from vllm_seqhooks.scripted import tiny_model

        tiny_model.build_tokenizer().save(os.path.join(d, "tokenizer.json"))
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump(tiny_model._tokenizer_config(), f)
        _MODEL_DIR = d
    return _MODEL_DIR


def default_hooks(**overrides: Any) -> SpecialKwargs:
    """Resolved hook settings (no tokenizer needed): the tiny model's ids."""
    base: dict[str, Any] = dict(
        sync_token_id=SYNC_ID,
        promise_token_id=PROMISE_ID,
        promise_end_token_id=PROMISE_END_ID,
        merge_separator_token_ids=[SEP_ID],
    )
    base.update(overrides)
    if base.get("failed_child_marker") is not None and base.get(
        "failed_child_marker_token_ids"
    ) is None:
        base["failed_child_marker_token_ids"] = list(FAILED_MARKER_IDS)
    return SpecialKwargs(**base)


def make_vllm_config(
    async_scheduling: bool,
    *,
    num_blocks: int = 64,
    block_size: int = 16,
    max_num_seqs: int = 16,
    max_model_len: int = 512,
    max_num_batched_tokens: int | None = None,
    enable_prefix_caching: bool = True,
    hooks: SpecialKwargs | dict | None = None,
    policy: str = "fcfs",
    num_spec_tokens: int = 0,
):
    """A VllmConfig built offline; ``hooks`` None means no seqhooks config;
    ``num_spec_tokens`` > 0 configures ngram speculative decoding."""
    from vllm.config import (
        CacheConfig,
        ModelConfig,
        SchedulerConfig,
        VllmConfig,
    )

    if max_num_batched_tokens is None:
        max_num_batched_tokens = max(max_model_len, 256)
    model_config = ModelConfig(
        model=tiny_model_dir(),
        # Tag formats read text through the tokenizer; nothing else needs it.
        skip_tokenizer_init=not (isinstance(hooks, SpecialKwargs)
                                 and hooks.tag_format is not None),
        max_model_len=max_model_len,
        dtype="float32",
        seed=0,
    )
    scheduler_config = SchedulerConfig(
        max_model_len=max_model_len,
        is_encoder_decoder=False,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        enable_chunked_prefill=True,
        async_scheduling=async_scheduling,
        policy=policy,
    )
    cache_config = CacheConfig(
        block_size=block_size, enable_prefix_caching=enable_prefix_caching
    )
    additional: dict[str, Any] = {}
    if hooks is not None:
        if isinstance(hooks, dict):
            hooks = default_hooks(**hooks)
        additional = hooks.to_additional_config()
    speculative_config = (_ngram_config(num_spec_tokens, async_scheduling, model_config)
                          if num_spec_tokens else None)
    vllm_config = VllmConfig(
        model_config=model_config,
        scheduler_config=scheduler_config,
        cache_config=cache_config,
        speculative_config=speculative_config,
        additional_config=additional,
    )
    # The CPU platform turns async scheduling off; the scheduler itself does
    # not care which platform it runs on.
    vllm_config.scheduler_config.async_scheduling = async_scheduling
    vllm_config.cache_config.num_gpu_blocks = num_blocks
    return vllm_config


def _ngram_config(num_spec_tokens: int, async_scheduling: bool, model_config):
    from vllm.config import ParallelConfig, SpeculativeConfig

    return SpeculativeConfig(
        # vLLM allows async scheduling with the GPU n-gram proposer only.
        method="ngram_gpu" if async_scheduling else "ngram",
        num_speculative_tokens=num_spec_tokens,
        prompt_lookup_max=num_spec_tokens,
        prompt_lookup_min=1,
        target_model_config=model_config,
        target_parallel_config=ParallelConfig(),
    )


def make_kv_cache_config(num_blocks: int, block_size: int):
    import torch
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
    )

    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer"],
                FullAttentionSpec(
                    block_size=block_size,
                    num_kv_heads=1,
                    head_size=16,
                    dtype=torch.float32,
                ),
            )
        ],
    )


def block_hasher(block_size: int):
    global _HASH_READY
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    if not _HASH_READY:
        init_none_hash(sha256)
        _HASH_READY = True
    return get_request_block_hasher(block_size, sha256)


def make_scheduler(
    async_scheduling: bool,
    *,
    num_blocks: int = 64,
    block_size: int = 16,
    max_num_seqs: int = 16,
    max_model_len: int = 512,
    max_num_batched_tokens: int | None = None,
    enable_prefix_caching: bool = True,
    hooks: dict | SpecialKwargs | None = None,
    stock: bool = False,
    log_stats: bool = False,
    policy: str = "fcfs",
    include_finished_set: bool = False,
    num_spec_tokens: int = 0,
):
    """Build ``SeqHooksScheduler`` (or, with ``stock=True``, vLLM's own
    ``Scheduler`` / ``AsyncScheduler`` on the same config).

    ``hooks``: a dict of :class:`SpecialKwargs` overrides on top of
    :func:`default_hooks`, or a SpecialKwargs."""
    from vllm.v1.structured_output import StructuredOutputManager

    if stock:
        spec = None
    elif isinstance(hooks, SpecialKwargs):
        spec = hooks
    else:
        spec = default_hooks(**(hooks or {}))
    vllm_config = make_vllm_config(
        async_scheduling,
        num_blocks=num_blocks,
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        max_num_batched_tokens=max_num_batched_tokens,
        enable_prefix_caching=enable_prefix_caching,
        hooks=spec,
        policy=policy,
        num_spec_tokens=num_spec_tokens,
    )
    kv_cache_config = make_kv_cache_config(num_blocks, block_size)
    kwargs = dict(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=block_size,
        log_stats=log_stats,
        include_finished_set=include_finished_set,
    )
    if stock:
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler

        cls = AsyncScheduler if async_scheduling else Scheduler
        return cls(**kwargs)
    from vllm_seqhooks.engine.scheduler import SeqHooksScheduler

    return SeqHooksScheduler(**kwargs)


def make_request(
    request_id: str,
    prompt_token_ids: Sequence[int],
    *,
    block_size: int,
    max_tokens: int = 16,
    min_tokens: int = 0,
    extra_args: dict | None = None,
    seed: int | None = None,
    stop_token_ids: list[int] | None = None,
    client_index: int = 0,
    arrival_time: float | None = None,
    resumable: bool = False,
    priority: int = 0,
    eos_token_id: int = EOS_ID,
):
    from vllm import SamplingParams
    from vllm.v1.request import Request

    sp = SamplingParams(
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        temperature=0.0,
        seed=seed,
        extra_args=extra_args,
        stop_token_ids=stop_token_ids,
    )
    # What the frontend does with the model's generation config.
    sp.update_from_generation_config({}, eos_token_id=eos_token_id)
    return Request(
        request_id=request_id,
        prompt_token_ids=list(prompt_token_ids),
        sampling_params=sp,
        pooling_params=None,
        client_index=client_index,
        arrival_time=arrival_time,
        block_hasher=block_hasher(block_size),
        resumable=resumable,
        priority=priority,
    )
