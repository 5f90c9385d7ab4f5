"""The private vLLM API the fork/join scheduler relies on, in one place.

vLLM's scheduler internals are not a public interface. The engine package
uses the names below; :func:`check` verifies, at import time, that the
installed vLLM is the pinned release and still has each of them with the
expected signature, so that a vLLM upgrade fails loudly at start-up (and in
``tests/test_vllm_private.py``) instead of misbehaving at run time. The two
patches that wrap private methods are implemented here too; they are listed,
and installed, by :mod:`vllm_seqhooks.engine.patches`.
"""

from __future__ import annotations

import dataclasses
import inspect

PINNED_VLLM_VERSION = "0.32.0"

#: (module, class, attribute, expected parameter names or None for a non-callable)
SCHEDULER_METHODS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("_update_request_with_output", ("self", "request", "new_token_ids", "is_stale")),
    ("_handle_stopped_request", ("self", "request")),
    ("_update_request_as_session", ("self", "session", "update")),
    ("_free_request_blocks", ("self", "request")),
    ("_free_request", ("self", "request", "delay_free_blocks")),
    ("_preempt_request", ("self", "request", "timestamp", "drop_stale_output")),
    ("_handle_blocked_waiting_request", ("self", "request")),
    ("finish_requests", ("self", "request_ids", "finished_status")),
    ("add_request", ("self", "request")),
    ("update_from_output", ("self", "scheduler_output", "model_runner_output")),
    ("schedule", ("self", "throttle_prefills")),
    ("update_draft_token_ids", ("self", "draft_token_ids")),
)

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
    "use_v2_model_runner",
    "vllm_config",
    "hash_block_size",
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


#: The V1 model runner (GPU with VLLM_USE_V2_MODEL_RUNNER=0, and the CPU
#: runner, its subclass): the per-step batch reordering hook wrapped by
#: :func:`install_family_batch_order`, and the InputBatch API it uses.
MODEL_RUNNER_METHODS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("_may_reorder_batch", ("self", "scheduler_output")),
)
INPUT_BATCH_METHODS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("swap_states", ("self", "i1", "i2")),
)
INPUT_BATCH_PROPERTIES = ("req_ids", "num_reqs")
#: ``InputBatch.batch_update_builder``'s record of this step's changes.
BATCH_CHANGE_LISTS = ("added", "moved")


class VllmPrivateAPIError(ImportError):
    """The installed vLLM does not match what vllm_seqhooks was built on."""


def _method_problems(cls: type, methods: tuple[tuple[str, tuple[str, ...]], ...]) -> list[str]:
    found = []
    for name, params in methods:
        fn = getattr(cls, name, None)
        if fn is None:
            found.append(f"{cls.__name__}.{name} is missing")
            continue
        got = tuple(inspect.signature(fn).parameters)
        if got != params:
            found.append(f"{cls.__name__}.{name}{got} != expected {params}")
    return found


def problems() -> list[str]:
    """Everything that differs from the pinned vLLM (empty when all is well)."""
    import vllm
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine import EngineCoreOutput
    from vllm.v1.request import Request, RequestStatus, StreamingUpdate

    found: list[str] = []
    version = getattr(vllm, "__version__", "?")
    if version.split("+")[0] != PINNED_VLLM_VERSION:
        found.append(
            f"vLLM {version} is installed; vllm-seqhooks is pinned to "
            f"{PINNED_VLLM_VERSION}"
        )
    found += _method_problems(Scheduler, SCHEDULER_METHODS)
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
    found += _block_hasher_problems()
    found += _waiting_queue_problems()
    return found


def _block_hasher_problems() -> list[str]:
    """What :func:`share_block_hashes` relies on: the engine's block hasher
    hashes from the request's first block without a hash, chaining on the
    last one it has; ``Request.update_block_hashes`` runs it."""
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher
    from vllm.v1.request import Request

    src = inspect.getsource(get_request_block_hasher)
    found = []
    if ("len(request.block_hashes) * hash_block_size" not in src
            or "request.block_hashes[-1]" not in src):
        found.append("get_request_block_hasher no longer continues from the "
                     "request's existing block hashes")
    if "update_block_hashes" not in vars(Request):
        found.append("Request.update_block_hashes is missing")
    return found


def share_block_hashes(child, parent, hash_block_size: int) -> None:
    """Give ``child`` (built with ``block_hasher=None``) its parent's block
    hasher and the block hashes of the whole blocks its prompt shares with
    the parent's tokens, then hash only the rest, as vLLM would have
    hashed the whole prompt (the same tokens, LoRA and cache salt give the
    same chained hashes). A parent with multimodal features or prompt
    embeddings (extra hash keys the child does not have) shares none."""
    hasher = parent._block_hasher
    if hasher is None:
        return
    child._block_hasher = hasher
    shared = 0
    if not parent.mm_features and parent.prompt_embeds is None:
        shared = min(len(parent.block_hashes), len(child.prompt_token_ids) // hash_block_size)
        end = shared * hash_block_size
        if shared and parent._all_token_ids[:end] != child.prompt_token_ids[:end]:
            shared = 0
    child.block_hashes = parent.block_hashes[:shared]
    child.update_block_hashes()


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


_checked = False


def check() -> None:
    """Raise :class:`VllmPrivateAPIError` listing every mismatch."""
    global _checked
    if _checked:
        return
    found = problems()
    if found:
        raise VllmPrivateAPIError(
            "vllm_seqhooks cannot run on this vLLM:\n  - " + "\n  - ".join(found)
        )
    _checked = True


def model_runner_problems() -> list[str]:
    """Like :func:`problems`, for the model-runner names (imported only in
    the processes that run a model)."""
    from vllm.v1.sample.logits_processor.state import BatchUpdateBuilder
    from vllm.v1.worker.gpu_input_batch import InputBatch
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    found = _method_problems(GPUModelRunner, MODEL_RUNNER_METHODS)
    found += _method_problems(InputBatch, INPUT_BATCH_METHODS)
    for name in INPUT_BATCH_PROPERTIES:
        if not isinstance(getattr(InputBatch, name, None), property):
            found.append(f"InputBatch.{name} is no longer a property")
    src = inspect.getsource(GPUModelRunner._update_states)
    if "self._may_reorder_batch(" not in src:
        found.append("GPUModelRunner._update_states no longer calls _may_reorder_batch")
    # What entered or moved in the batch this step, read before regrouping.
    for name in BATCH_CHANGE_LISTS:
        if name not in BatchUpdateBuilder.__annotations__:
            found.append(f"BatchUpdateBuilder.{name} is missing")
    if "self.batch_update_builder = BatchUpdateBuilder(" not in inspect.getsource(
            InputBatch.__init__):
        found.append("InputBatch no longer keeps a BatchUpdateBuilder")
    for method, changes in (("_register_add_request", "added"), ("condense", "moved"),
                            ("swap_states", "moved")):
        if f".{changes}.append(" not in inspect.getsource(getattr(InputBatch, method)):
            found.append(f"InputBatch.{method} no longer records {changes}")
    return found


#: The frontend's admission path: the per-request params validator that
#: :func:`install_request_validator` extends with the hooks' own checks.
INPUT_PROCESSOR_METHODS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("_build_logits_processors_params_validator", ("self",)),
    ("_validate_params", ("self", "params", "supported_tasks")),
)


def input_processor_problems() -> list[str]:
    """Like :func:`problems`, for the frontend's admission path."""
    from vllm.v1.engine.input_processor import InputProcessor

    found = _method_problems(InputProcessor, INPUT_PROCESSOR_METHODS)
    init_src = inspect.getsource(InputProcessor.__init__)
    if "self._build_logits_processors_params_validator()" not in init_src:
        found.append("InputProcessor.__init__ no longer builds its params validator")
    src = inspect.getsource(InputProcessor._validate_params)
    if "self.validate_logits_processors_params(params)" not in src:
        found.append("InputProcessor._validate_params no longer runs the params validator")
    return found


_REQUEST_VALIDATOR_MARK = "_seqhooks_request_validator"


def install_request_validator() -> None:
    """Make the frontend of every engine with hooks run
    :func:`vllm_seqhooks.engine.validation.check_request` on each request it admits
    (once per process; engines without hooks are untouched).

    vLLM's ``InputProcessor`` builds one params validator at start-up and
    calls it for every request in ``_validate_params``; the wrapper chains
    the hooks' check after vLLM's own. It works the same for both model
    runners and costs nothing per step. Raises :class:`VllmPrivateAPIError`
    when the installed vLLM lacks what it needs: requests would otherwise
    reach the engine unchecked."""
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.engine.input_processor import InputProcessor

    from vllm_seqhooks.engine.validation import chain_validators, hooks_enabled

    original = InputProcessor._build_logits_processors_params_validator
    if getattr(original, _REQUEST_VALIDATOR_MARK, False):
        return
    found = input_processor_problems()
    if found:
        raise VllmPrivateAPIError(
            "vllm_seqhooks cannot validate requests on this vLLM:\n  - "
            + "\n  - ".join(found)
        )

    def _build_logits_processors_params_validator(self):
        validator = original(self)
        if hooks_enabled(getattr(self.vllm_config, "additional_config", None)):
            validator = chain_validators(validator, VLLMValidationError)
        return validator

    setattr(_build_logits_processors_params_validator, _REQUEST_VALIDATOR_MARK, True)
    _build_logits_processors_params_validator.__wrapped__ = original  # type: ignore[attr-defined]
    InputProcessor._build_logits_processors_params_validator = (  # type: ignore[method-assign]
        _build_logits_processors_params_validator
    )


#: Model Runner V2 builds each step's batch from the scheduler output's
#: request order through this function (stable sort: drafts, then decodes);
#: the scheduler relies on that to keep families together on V2.
V2_BATCH_SORT = ("sort_batch_req_ids", ("num_tokens_per_req", "draft_tokens", "decode_query_len"))


def v2_model_runner_problems() -> list[str]:
    """Like :func:`problems`, for what the scheduler assumes of Model Runner V2."""
    from vllm.v1.worker.gpu import model_runner

    name, params = V2_BATCH_SORT
    fn = getattr(model_runner, name, None)
    if fn is None:
        return [f"vllm.v1.worker.gpu.model_runner.{name} is missing"]
    found = []
    got = tuple(inspect.signature(fn).parameters)
    if got != params:
        found.append(f"{name}{got} != expected {params}")
    src = inspect.getsource(model_runner.GPUModelRunner.gather_batch_req_state)
    if f"{name}(" not in src or "scheduler_output.num_scheduled_tokens" not in src:
        found.append("GPUModelRunner.gather_batch_req_state no longer orders the batch "
                     f"with {name} over the scheduler output")
    return found


_FAMILY_ORDER_MARK = "_seqhooks_family_order"
_BACKEND_MOVED = "_seqhooks_backend_moved"


def install_family_batch_order() -> bool:
    """Wrap ``GPUModelRunner._may_reorder_batch`` (once per process) so that,
    in engines whose hooks ask for ``batch_order="family"``, each fork/join
    family is contiguous in the persistent batch before the attention
    backend's own reordering runs (see :mod:`vllm_seqhooks.core.batch_order`).
    Engines without hooks in the same process are untouched (the setting is
    read from each runner's ``vllm_config.additional_config``). Returns
    False, logging why, when the installed vLLM does not have what it needs:
    the batch then keeps vLLM's order, and nothing else changes."""
    import logging

    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_seqhooks.config.special_kwargs import ADDITIONAL_CONFIG_KEY
    from vllm_seqhooks.core.batch_order import grouping_swaps

    original = GPUModelRunner._may_reorder_batch
    if getattr(original, _FAMILY_ORDER_MARK, False):
        return True
    found = model_runner_problems()
    if found:
        logging.getLogger("vllm.seqhooks").warning(
            "vllm-seqhooks: not grouping families in the batch: %s", "; ".join(found))
        return False

    def _may_reorder_batch(self, scheduler_output):
        enabled = self.__dict__.get(_FAMILY_ORDER_MARK)
        if enabled is None:
            extra = getattr(self.vllm_config, "additional_config", None) or {}
            hooks = extra.get(ADDITIONAL_CONFIG_KEY) if isinstance(extra, dict) else None
            enabled = bool(hooks) and hooks.get("batch_order", "family") == "family"
            self.__dict__[_FAMILY_ORDER_MARK] = enabled
        if not enabled:
            return original(self, scheduler_output)
        batch = self.input_batch
        changes = batch.batch_update_builder
        # The batch was grouped at the end of the last step unless a request
        # entered it, the runner moved one (condense), or the attention
        # backend's own reordering moved some after ours.
        if changes.added or changes.moved or self.__dict__.get(_BACKEND_MOVED):
            for i, j in grouping_swaps(batch.req_ids[: batch.num_reqs]):
                batch.swap_states(i, j)
        ours = len(changes.moved)
        try:
            return original(self, scheduler_output)
        finally:
            self.__dict__[_BACKEND_MOVED] = len(changes.moved) > ours

    setattr(_may_reorder_batch, _FAMILY_ORDER_MARK, True)
    _may_reorder_batch.__wrapped__ = original  # type: ignore[attr-defined]
    GPUModelRunner._may_reorder_batch = _may_reorder_batch  # type: ignore[method-assign]
    return True
