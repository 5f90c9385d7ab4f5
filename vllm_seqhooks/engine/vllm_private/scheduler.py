"""The scheduler's side: the private names of vLLM's scheduler, requests
and waiting queue that the engine package uses, and what it builds on them
(a child's block hashes, the children-first waiting queue)."""

from __future__ import annotations

import dataclasses
import inspect

from vllm_seqhooks.engine.vllm_private.releases import Release, installed
from vllm_seqhooks.engine.vllm_private.common import method_problems


SCHEDULER_METHODS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("_update_request_with_output", ("self", "request", "new_token_ids", "is_stale")),
    ("_handle_stopped_request", ("self", "request")),
    ("_update_request_as_session", ("self", "session", "update")),
    ("_enqueue_waiting_request", ("self", "request")),
    ("_holds_kv_blocks", ("request",)),
    ("_free_request_blocks", ("self", "request")),
    ("_free_request", ("self", "request", "delay_free_blocks")),
    ("_free_blocks", ("self", "request")),
    ("_preempt_request", ("self", "request", "timestamp", "drop_stale_output")),
    ("_handle_blocked_waiting_request", ("self", "request")),
    ("_get_local_prefix_cache_hit", ("self", "request")),
    ("finish_requests", ("self", "request_ids", "finished_status")),
    ("reset_prefix_cache", ("self", "reset_running_requests", "reset_connector")),
    ("add_request", ("self", "request")),
    ("update_from_output", ("self", "scheduler_output", "model_runner_output")),
    ("schedule", ("self", "throttle_prefills")),
    ("update_draft_token_ids", ("self", "draft_token_ids")),
)

#: What a splice join asks the KV cache manager: a request's blocks, and
#: (for a parent whose KV was spilled) blocks for its context again.
KV_CACHE_MANAGER_METHODS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("get_block_ids", ("self", "request_id")),
    ("get_blocks", ("self", "request_id")),
    ("create_kv_cache_blocks", ("self", "blocks")),
    ("get_computed_blocks", ("self", "request")),
    ("truncate_computed_blocks", ("self", "blocks", "num_computed_tokens")),
    ("allocate_slots", ("self", "request", "num_new_tokens", "num_new_computed_tokens",
                        "new_computed_blocks", "num_lookahead_tokens",
                        "num_external_computed_tokens", "delay_cache_blocks",
                        "num_encoder_tokens", "full_sequence_must_fit", "reserved_blocks",
                        "has_scheduled_reqs", "skip_zeroing_group_ids")),
)

#: The parameter a release's prefix-cache hit methods add (see
#: ``releases.Release.hit_takes_max_length``).
_HIT_LIMIT = "max_cache_hit_length"


def expected_methods(table: tuple[tuple[str, tuple[str, ...]], ...],
                     release: Release) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``table`` as ``release`` has it (its prefix-cache hit methods take
    ``max_cache_hit_length`` too, where it says so)."""
    if not release.hit_takes_max_length:
        return table
    limited = ("_get_local_prefix_cache_hit", "get_computed_blocks")
    return tuple((name, params + (_HIT_LIMIT,) if name in limited else params)
                 for name, params in table)


#: Attributes set in KVCacheManager.__init__ that a splice join reads.
KV_CACHE_MANAGER_ATTRIBUTES = ("enable_caching",)

#: Attributes set in Scheduler.__init__ that scheduler.py reads or writes.
SCHEDULER_ATTRIBUTES = (
    "requests",
    "running",
    "waiting",
    "kv_holding_waiting",
    "deferred_waiting",
    "num_waiting_for_streaming_input",
    "finished_req_ids",
    "kv_cache_manager",
    "max_model_len",
    "block_size",
    "max_num_running_reqs",
    "max_num_active_reqs",
    "use_v2_model_runner",
    "vllm_config",
    "hash_block_size",
    "structured_output_manager",
)

#: Request internals (attributes of a constructed Request).
REQUEST_ATTRIBUTES = (
    "_output_token_ids",
    "_all_token_ids",
    "_block_hasher",
    "resumable",
    "streaming_queue",
    "num_computed_tokens",
    "num_prompt_tokens",
    "prompt_token_ids",
    "max_tokens",
    "stop_reason",
    "is_prefill_chunk",
    "num_output_placeholders",
    "spec_token_ids",
    "block_hashes",
    "mm_features",
    "prompt_embeds",
)

REQUEST_INIT_PARAMS = (
    "request_id",
    "prompt_token_ids",
    "sampling_params",
    "pooling_params",
    "client_index",
    "arrival_time",
    "lora_request",
    "cache_salt",
    "priority",
    "trace_headers",
    "block_hasher",
)

STREAMING_UPDATE_FIELDS = (
    "mm_features",
    "prompt_token_ids",
    "max_tokens",
    "arrival_time",
    "sampling_params",
)

ENGINE_CORE_OUTPUT_FIELDS = (
    "request_id",
    "new_token_ids",
    "finish_reason",
    "stop_reason",
    "kv_transfer_params",
)


def scheduler_problems(release: Release) -> list[str]:
    """What differs from ``release`` (the installed vLLM's) in what the
    scheduler uses."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine import EngineCoreOutput
    from vllm.v1.request import Request, RequestStatus, StreamingUpdate

    from vllm.v1.core.kv_cache_manager import KVCacheManager

    found = method_problems(Scheduler, expected_methods(SCHEDULER_METHODS, release))
    found += method_problems(KVCacheManager,
                             expected_methods(KV_CACHE_MANAGER_METHODS, release))
    kv_init_src = inspect.getsource(KVCacheManager.__init__)
    for attr in KV_CACHE_MANAGER_ATTRIBUTES:
        if f"self.{attr}" not in kv_init_src:
            found.append(f"KVCacheManager.{attr} is no longer set in __init__")
    if not issubclass(AsyncScheduler, Scheduler):
        found.append("AsyncScheduler is no longer a Scheduler subclass")
    init_src = inspect.getsource(Scheduler.__init__)
    for attr in SCHEDULER_ATTRIBUTES:
        if f"self.{attr}" not in init_src and not hasattr(Scheduler, attr):
            found.append(f"Scheduler.{attr} is no longer set in __init__")
    req_params = inspect.signature(Request.__init__).parameters
    for p in REQUEST_INIT_PARAMS:
        if p not in req_params:
            found.append(f"Request.__init__ lost parameter {p!r}")
    req_src = inspect.getsource(Request.__init__)
    for attr in REQUEST_ATTRIBUTES:
        if f"self.{attr}" not in req_src and not hasattr(Request, attr):
            found.append(f"Request.{attr} is no longer set")
    fields = tuple(f.name for f in dataclasses.fields(StreamingUpdate))
    if fields != STREAMING_UPDATE_FIELDS:
        found.append(f"StreamingUpdate fields {fields} != {STREAMING_UPDATE_FIELDS}")
    eco_fields = set(EngineCoreOutput.__struct_fields__)
    for f in ENGINE_CORE_OUTPUT_FIELDS:
        if f not in eco_fields:
            found.append(f"EngineCoreOutput lost field {f!r}")
    if not hasattr(RequestStatus, "WAITING_FOR_STREAMING_REQ"):
        found.append("RequestStatus.WAITING_FOR_STREAMING_REQ is missing")
    found += _block_hasher_problems(release)
    found += _child_params_problems()
    found += _grammar_problems()
    found += _partial_hit_problems()
    found += _waiting_queue_problems()
    found += _world_group_problems()
    return found


def _child_params_problems() -> list[str]:
    """Every SamplingParams field has a child rule (core/child_params.py)."""
    from vllm import SamplingParams

    from vllm_seqhooks.core.child_params import unruled

    return [f"SamplingParams.{name} has no rule for children in "
            "vllm_seqhooks/core/child_params.py" for name in unruled(SamplingParams.__struct_fields__)]


#: What a join asks of vLLM's structured-output manager: the parent's
#: grammar advanced over the merged tokens (the grammar a streaming-session
#: update keeps: ``_update_request_as_session`` does not rebuild it).
GRAMMAR_METHODS = (("accept_tokens", ("self", "request", "new_token_ids")),
                   ("validate_tokens", ("self", "request", "spec_tokens")))


def _grammar_problems() -> list[str]:
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager

    found = method_problems(StructuredOutputManager, GRAMMAR_METHODS)
    if "structured_output_request" in inspect.getsource(Scheduler._update_request_as_session):
        found.append("Scheduler._update_request_as_session now touches the structured-output "
                     "request (a join feeds the merged tokens to the grammar it keeps)")
    return found


def world_cpu_group():
    """The CPU (gloo) process group over every rank of this engine: vLLM's
    world group, initialized by the worker before the scheduler is built
    (with ``external_launcher`` both live in each rank's process)."""
    from vllm.distributed.parallel_state import get_world_group

    return get_world_group().cpu_group


def _world_group_problems() -> list[str]:
    from vllm.distributed import parallel_state

    if not callable(getattr(parallel_state, "get_world_group", None)):
        return ["vllm.distributed.parallel_state.get_world_group is gone"]
    init_src = inspect.getsource(parallel_state.GroupCoordinator.__init__)
    if "self.cpu_group" not in init_src:
        return ["GroupCoordinator.cpu_group is no longer set in __init__"]
    return []


def _partial_hit_problems() -> list[str]:
    """What :func:`hit_with_partial_block` relies on: a local hit that ends
    inside its last block is copied on write into a block of the request's
    own, and the copies reach the workers in the scheduler output."""
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.core.single_type_kv_cache_manager import SingleTypeKVCacheManager

    found = []
    src = inspect.getsource(SingleTypeKVCacheManager.add_local_computed_blocks)
    if "_partial_hit_reqs" not in src or not hasattr(SingleTypeKVCacheManager, "_apply_cow"):
        found.append("SingleTypeKVCacheManager no longer copies a partial local hit on write")
    if "kv_cache_block_copies" not in {f.name for f in dataclasses.fields(SchedulerOutput)}:
        found.append("SchedulerOutput.kv_cache_block_copies is gone")
    return found


def _block_hasher_problems(release: Release) -> list[str]:
    """What :func:`share_block_hashes` relies on: the engine's block hasher
    hashes from the request's first block without a hash, chaining on the
    last one it has; ``Request.update_block_hashes`` runs it. A release with
    look-ahead hashes says how far on the scheduler
    (:func:`hash_lookahead_tokens`)."""
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import Request

    src = inspect.getsource(get_request_block_hasher)
    found = []
    if release.hashes_with_lookahead and (
            "num_hash_lookahead_tokens" not in inspect.signature(
                get_request_block_hasher).parameters
            or "self.num_hash_lookahead_tokens" not in inspect.getsource(Scheduler.__init__)):
        found.append("the block hasher's look-ahead (num_hash_lookahead_tokens) is gone")
    if ("len(request.block_hashes) * hash_block_size" not in src
            or "request.block_hashes[-1]" not in src):
        found.append("get_request_block_hasher no longer continues from the "
                     "request's existing block hashes")
    if "update_block_hashes" not in vars(Request):
        found.append("Request.update_block_hashes is missing")
    return found


def hash_lookahead_tokens(sched) -> int:
    """How many tokens past a block its hash covers on this engine (vLLM
    0.33 with EAGLE and prefix caching: ``num_hash_lookahead_tokens``; 0
    on a release without look-ahead hashes)."""
    if not installed().hashes_with_lookahead:
        return 0
    return int(sched.num_hash_lookahead_tokens)


def share_block_hashes(child, parent, hash_block_size: int, shared_tokens: int,
                       lookahead: int = 0) -> None:
    """Give ``child`` (built with ``block_hasher=None``) its parent's block
    hasher and the block hashes of the whole blocks among the
    ``shared_tokens`` first tokens its prompt shares with the parent's
    tokens, then hash only the rest, as vLLM would have hashed the whole
    prompt (the same tokens, LoRA and cache salt give the same chained
    hashes). A hash that covers ``lookahead`` tokens past its block (see
    :func:`hash_lookahead_tokens`) is shared only when those are shared
    too. A parent with multimodal features or prompt embeddings (extra
    hash keys the child does not have) shares none."""
    hasher = parent._block_hasher
    if hasher is None:
        return
    child._block_hasher = hasher
    shared = 0
    if not parent.mm_features and parent.prompt_embeds is None:
        shared = min(len(parent.block_hashes),
                     max(0, shared_tokens - lookahead) // hash_block_size)
    child.block_hashes = parent.block_hashes[:shared]
    child.update_block_hashes()


def allocate_join_blocks(kv_cache_manager, request, num_tokens: int, block_size: int,
                         donor_id: str | None = None, donor_tokens: int = 0) -> int | None:
    """Make ``request`` hold KV blocks for its first ``num_tokens`` tokens
    now (a splice join: what the parent keeps, the paths it copies and the
    suffix), so that it never waits for blocks while its children's are
    held. A request that holds none (its KV was spilled, or it gave its
    blocks back to adopt its first child's) first takes ``donor_id``'s
    whole blocks of its first ``donor_tokens`` tokens (the same tokens as
    its own there), or else the prefix cache's whole blocks of its tokens.
    Returns how many of its first tokens already have their KV in these
    blocks; the caller copies the others before they are read. The new
    blocks enter the prefix cache when vLLM next schedules the request, as
    any block it computes. None: not enough free blocks (nothing was
    allocated)."""
    have = request.num_computed_tokens
    given, count = None, 0
    if have == 0 and donor_id is not None and donor_tokens:
        count = donor_tokens
        given = kv_cache_manager.truncate_computed_blocks(
            kv_cache_manager.get_blocks(donor_id), count)
    elif have == 0:
        found, hits, _ = kv_cache_manager.get_computed_blocks(request)
        count = min(hits, num_tokens - 1) // block_size * block_size
        if count:
            given = kv_cache_manager.truncate_computed_blocks(found, count)
    new = kv_cache_manager.allocate_slots(
        request, num_tokens - have - count, num_new_computed_tokens=count,
        new_computed_blocks=given, delay_cache_blocks=True)
    return None if new is None else have + count


def hit_with_partial_block(kv_cache_manager, hit_blocks, owner_id: str, index: int):
    """A prefix-cache hit's blocks (``KVCacheBlocks``) and, after them,
    block ``index`` of request ``owner_id``, which its tokens fill only in
    part: handed to vLLM as a hit ending inside that block, vLLM copies it
    into a block of the request's own before its first step (its
    copy-on-write of a partial hit) and computes from there."""
    (found,) = hit_blocks.blocks
    (owned,) = kv_cache_manager.get_blocks(owner_id).blocks
    return kv_cache_manager.create_kv_cache_blocks(([*found, owned[index]],))


def adopt_block_hashes(request, donor, num_tokens: int, hash_block_size: int,
                       lookahead: int = 0) -> None:
    """``request`` holds ``donor``'s blocks of its first ``num_tokens``
    tokens (the same tokens as its own there): its block hashes there
    become the donor's (under which the prefix cache knows those blocks),
    those whose ``lookahead`` tokens past the block are among them too, and
    its later ones are hashed again, chained on them."""
    del request.block_hashes[:]
    request.block_hashes.extend(
        donor.block_hashes[: max(0, num_tokens - lookahead) // hash_block_size])
    request.update_block_hashes()


_SALT_MARK = "_seqhooks_salt"


def salt_block_hashes(request, salt: bytes) -> None:
    """From now on, the block hashes ``request`` gets (for the blocks its
    new tokens fill) are vLLM's mixed with ``salt``; each chains on the
    last, so every later one differs from vLLM's too. A request whose KV
    is not what its tokens alone would give (a splice join) is then never
    served from the prefix cache to another request, and it shares its
    blocks with the children it spawns later (they take its hasher)."""
    import hashlib

    hasher = request._block_hasher
    if hasher is None or getattr(hasher, _SALT_MARK, None) == salt:
        return

    def salted(req):
        return [type(h)(hashlib.sha256(salt + bytes(h)).digest()) for h in hasher(req)]

    setattr(salted, _SALT_MARK, salt)
    request._block_hasher = salted


#: What vLLM's FCFS waiting queue defines, each through the deque methods
#: that :class:`~vllm_seqhooks.core.child_queue.ChildrenFirst` counts on.
FCFS_QUEUE_METHODS = {
    "add_request": "self.append(",
    "pop_request": "self.popleft(",
    "peek_request": "self[0]",
    "prepend_request": "self.appendleft(",
    "prepend_requests": "self.extendleft(",
    "remove_request": "self.remove(",
    "remove_requests": "self.extend(",
    "__bool__": "len(self)",
    "__len__": "__len__()",
    "__iter__": "__iter__()",
}


def _waiting_queue_problems() -> list[str]:
    from collections import deque

    from vllm.v1.core.sched.request_queue import FCFSRequestQueue
    from vllm.v1.core.sched.scheduler import Scheduler

    found = []
    if not issubclass(FCFSRequestQueue, deque):
        found.append("FCFSRequestQueue is no longer a deque")
    own = {name for name, value in vars(FCFSRequestQueue).items()
           if callable(value) and name not in ("__init__", "__class_getitem__")}
    if own - FCFS_QUEUE_METHODS.keys():
        found.append(f"FCFSRequestQueue has new methods {sorted(own - FCFS_QUEUE_METHODS.keys())}")
    for name, uses in FCFS_QUEUE_METHODS.items():
        fn = vars(FCFSRequestQueue).get(name)
        if fn is None or uses not in inspect.getsource(fn):
            found.append(f"FCFSRequestQueue.{name} no longer uses {uses!r}")
    if "self.waiting = create_request_queue(" not in inspect.getsource(Scheduler.__init__):
        found.append("Scheduler.__init__ no longer creates its waiting queue")
    return found


def children_first_queue(is_child):
    """An empty FCFS waiting queue that is also a
    :class:`~vllm_seqhooks.core.child_queue.ChildrenFirst`: vLLM uses it
    as its own (every method of its FCFS queue works through the deque
    methods ChildrenFirst counts), and children find their place in it
    by binary search."""
    from vllm.v1.core.sched.request_queue import FCFSRequestQueue

    from vllm_seqhooks.core.child_queue import ChildrenFirst

    global _ChildrenFirstQueue
    if _ChildrenFirstQueue is None:
        _ChildrenFirstQueue = type("ChildrenFirstRequestQueue",
                                   (ChildrenFirst, FCFSRequestQueue), {"__module__": __name__})
    return _ChildrenFirstQueue(is_child=is_child)


_ChildrenFirstQueue = None
