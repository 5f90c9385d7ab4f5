"""The model runners' side: what the worker patches wrap in vLLM's V1 and
V2 model runners (the family batch order, the splice inputs) and what the
scheduler assumes of how V2 orders its batch."""

from __future__ import annotations

import dataclasses
import inspect
import logging

from vllm_seqhooks.engine.vllm_private.common import (
    VllmPrivateAPIError,
    method_problems,
    wrap_method,
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


def model_runner_problems() -> list[str]:
    """Like :func:`problems`, for the model-runner names (imported only in
    the processes that run a model)."""
    from vllm.v1.sample.logits_processor.state import BatchUpdateBuilder
    from vllm.v1.worker.gpu_input_batch import InputBatch
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    found = method_problems(GPUModelRunner, MODEL_RUNNER_METHODS)
    found += method_problems(InputBatch, INPUT_BATCH_METHODS)
    for name in INPUT_BATCH_PROPERTIES:
        if not isinstance(getattr(InputBatch, name, None), property):
            found.append(f"InputBatch.{name} is no longer a property")
    src = inspect.getsource(GPUModelRunner._update_states)
    if "self._may_reorder_batch(" not in src:
        found.append("GPUModelRunner._update_states no longer calls _may_reorder_batch")
    # The most draft tokens a row of the batch holds (bounds what moves).
    if "self.num_spec_tokens = " not in inspect.getsource(GPUModelRunner.__init__):
        found.append("GPUModelRunner no longer keeps num_spec_tokens")
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
_GROUPING = "_seqhooks_family_grouping"


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
    from vllm_seqhooks.core.batch_order import FamilyGrouping
    from vllm_seqhooks.engine.vllm_private.input_batch import check_one_pass, permute_input_batch

    original = GPUModelRunner._may_reorder_batch
    if getattr(original, _FAMILY_ORDER_MARK, False):
        return True
    found = model_runner_problems()
    if found:
        logging.getLogger("vllm.seqhooks").warning(
            "vllm-seqhooks: not grouping families in the batch: %s", "; ".join(found))
        return False
    check_one_pass()  # at start-up: decided (and logged) once, not in a step

    def _may_reorder_batch(self, scheduler_output):
        state = self.__dict__
        grouping = state.get(_GROUPING)
        if grouping is None:  # first step: this engine's setting
            extra = getattr(self.vllm_config, "additional_config", None) or {}
            hooks = extra.get(ADDITIONAL_CONFIG_KEY) if isinstance(extra, dict) else None
            enabled = bool(hooks) and hooks.get("batch_order", "family") == "family"
            grouping = state[_GROUPING] = FamilyGrouping() if enabled else False
            state[_BACKEND_MOVED] = False
        if grouping is False:
            return original(self, scheduler_output)
        batch = self.input_batch
        changes = batch.batch_update_builder
        moved = changes.moved
        # The batch was grouped at the end of the last step unless a request
        # entered it, the runner moved one (condense), or the attention
        # backend's own reordering moved some after ours.
        if changes.added or moved or state[_BACKEND_MOVED]:
            moves = grouping.moves(batch.req_ids[: batch.num_reqs])
            if moves is not None:
                permute_input_batch(batch, moves, self.num_spec_tokens)
        ours = len(moved)
        original(self, scheduler_output)
        state[_BACKEND_MOVED] = len(moved) > ours

    wrap_method(GPUModelRunner, "_may_reorder_batch", _may_reorder_batch, _FAMILY_ORDER_MARK)
    return True


# ------------------------------------------------------------ splice inputs
#: The attribute of a SchedulerOutput that carries a step's splice work to
#: the workers (a :class:`~vllm_seqhooks.core.splice_inputs.SpliceInputs`;
#: absent in steps without any). SchedulerOutput is a plain dataclass: the
#: attribute travels with it to in-process and multiprocess workers alike.
SPLICE_INPUTS_ATTR = "seqhooks_splice_inputs"
_SPLICE_MARK = "_seqhooks_splice_inputs"
#: What a runner keeps for splice joins: its caches with their token
#: layouts, and (V2) the step's position shifts between two calls.
_KV_CACHES = "_seqhooks_kv_caches"
_STEP_SHIFTS = "_seqhooks_step_shifts"
#: What the wrappers below read of each model runner.
V1_SPLICE_METHODS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("_prepare_inputs", ("self", "scheduler_output", "num_scheduled_tokens")),
)
V2_SPLICE_METHODS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("prepare_inputs", ("self", "scheduler_output", "batch_req_state", "batch_desc",
                        "num_active_loras")),
    ("prepare_attn", ("self", "input_batch")),
)
V2_INPUT_BATCH_FIELDS = ("req_ids", "query_start_loc_np", "positions")


def token_elements(layer, cache):
    """Where the attention backend of ``layer`` writes one token's KV in a
    kernel block of ``cache`` (vLLM's 4-D view ``[blocks, heads, n, content]``
    of a layer's cache): an int tensor ``[n, elements, 3]`` of (head, row,
    column) coordinates, token by token, in the same order for each. Backends
    lay a block out in their own way (the CPU backend keeps a block's keys,
    then its values; FlashAttention each token's key and value side by
    side), so it is read off the backend's own cache write: each token is
    written alone into a scratch block and found there."""
    import torch

    _, heads, n, content = cache.shape
    scratch = torch.empty_strided((1, heads, n, content), cache.stride(), dtype=cache.dtype,
                                  device=cache.device)
    dtype = cache.dtype if cache.dtype.is_floating_point and cache.element_size() > 1 \
        else torch.bfloat16
    ones = torch.ones(1, layer.num_kv_heads, layer.head_size, dtype=dtype, device=cache.device)
    found = []
    for token in range(n):
        scratch.zero_()
        layer.impl.do_kv_cache_update(layer, ones, ones, scratch,
                                      torch.tensor([token], dtype=torch.long, device=cache.device))
        found.append((scratch[0] != 0).nonzero())
    if len({len(f) for f in found}) != 1 or not len(found[0]):
        raise VllmPrivateAPIError(
            f"{type(layer.impl).__name__} writes tokens of one block in unequal shapes")
    return torch.stack(found)


def copy_kv_slots(caches, copy_from: list[int], copy_to: list[int]) -> None:
    """Copy the KV of cache slots ``copy_from`` to ``copy_to``. ``caches``:
    ``(cache, token_elements)`` for every layer (slot ``s`` is token
    ``s % n`` of kernel block ``s // n``, ``n = cache.shape[2]``). Every copy
    reads the slots as they were before any is written."""
    import torch

    for cache, elements in caches:
        n = cache.shape[2]
        src = torch.tensor(copy_from, dtype=torch.long, device=cache.device)
        dst = torch.tensor(copy_to, dtype=torch.long, device=cache.device)
        elements = elements.to(cache.device)
        es, ed = elements[src % n], elements[dst % n]
        values = cache[(src // n)[:, None], es[..., 0], es[..., 1], es[..., 2]]
        cache[(dst // n)[:, None], ed[..., 0], ed[..., 1], ed[..., 2]] = values


def runner_kv_caches(runner):
    """Each attention layer's cache with its :func:`token_elements` (read
    once per runner, at its first splice join)."""
    known = runner.__dict__.get(_KV_CACHES)
    if known is None:
        layers = runner.compilation_config.static_forward_context
        probed: dict = {}
        known = []
        for layer in layers.values():
            cache = getattr(layer, "kv_cache", None)
            if getattr(layer, "impl", None) is None:
                continue
            if isinstance(cache, list):  # (one per virtual engine)
                cache = cache[0] if cache else None
            if cache is None or getattr(cache, "dim", lambda: 0)() != 4 or not cache.numel():
                continue
            key = (type(layer.impl), tuple(cache.shape), cache.stride(), cache.dtype)
            if key not in probed:
                probed[key] = token_elements(layer, cache)
            known.append((cache, probed[key]))
        runner.__dict__[_KV_CACHES] = known
    return known


def _copy_kv_for(runner, scheduler_output) -> dict | None:
    """Make a step's KV copies in ``runner``'s caches; the step's position
    shifts (None: none)."""
    splice = getattr(scheduler_output, SPLICE_INPUTS_ATTR, None)
    if splice is None:
        return None
    if splice.copy_from:
        copy_kv_slots(runner_kv_caches(runner), splice.copy_from, splice.copy_to)
    return splice.position_shift


def _shift_positions(positions, index_of, query_start_loc, shifts: dict) -> None:
    """Add each request's step runs (SpliceInputs.position_shift) to its
    slice of the step's positions."""
    for rid, runs in shifts.items():
        i = index_of(rid)
        if i is None:
            continue
        start, end = int(query_start_loc[i]), int(query_start_loc[i + 1])
        for k, (offset, shift) in enumerate(runs):
            stop = start + runs[k + 1][0] if k + 1 < len(runs) else end
            if shift:
                positions[start + offset:stop] += shift


def splice_problems() -> list[str]:
    """What :func:`install_splice_inputs` relies on in the V1 runner (the V2
    runner's part is checked where it is importable, see
    :func:`v2_splice_problems`)."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    found = method_problems(GPUModelRunner, V1_SPLICE_METHODS)
    src = inspect.getsource(GPUModelRunner._prepare_inputs)
    for needle in ("compute_slot_mapping(", "self.positions[", "self.query_start_loc.np["):
        if needle not in src:
            found.append(f"GPUModelRunner._prepare_inputs no longer has {needle!r}")
    return found


def v2_splice_problems() -> list[str]:
    from vllm.v1.worker.gpu.input_batch import InputBatch
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    found = method_problems(GPUModelRunner, V2_SPLICE_METHODS)
    fields = {f.name for f in dataclasses.fields(InputBatch)}
    found += [f"V2 InputBatch.{name} is missing" for name in V2_INPUT_BATCH_FIELDS
              if name not in fields]
    if "compute_slot_mappings(" not in inspect.getsource(GPUModelRunner.prepare_attn):
        found.append("V2 GPUModelRunner.prepare_attn no longer computes the slot mappings")
    return found


def install_splice_inputs() -> bool:
    """Make the model runners carry out a step's
    :data:`SPLICE_INPUTS_ATTR` (once per process): the KV copies before the
    forward pass, and the position shifts after the slot mapping was
    computed from the unshifted positions (a token's KV slot follows its
    index) and before the model reads them. V1: around ``_prepare_inputs``;
    V2: around ``prepare_inputs`` (copies) and ``prepare_attn`` (shifts).
    False (logged) when the installed vLLM lacks what they wrap."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    found = splice_problems()
    if found:
        logging.getLogger("vllm.seqhooks").error(
            "vllm-seqhooks: no splice joins in this worker: %s", "; ".join(found))
        return False
    if not getattr(GPUModelRunner._prepare_inputs, _SPLICE_MARK, False):
        original = GPUModelRunner._prepare_inputs

        def _prepare_inputs(self, scheduler_output, num_scheduled_tokens):
            shifts = _copy_kv_for(self, scheduler_output)
            out = original(self, scheduler_output, num_scheduled_tokens)
            if shifts:
                _shift_positions(self.positions, self.input_batch.req_id_to_index.get,
                                 self.query_start_loc.np, shifts)
            return out

        wrap_method(GPUModelRunner, "_prepare_inputs", _prepare_inputs, _SPLICE_MARK)
    return _install_v2_splice_inputs()


def _install_v2_splice_inputs() -> bool:
    try:
        from vllm.v1.worker.gpu.model_runner import GPUModelRunner as V2Runner
    except Exception:  # no Triton here: this process cannot run the V2 runner
        return True
    found = v2_splice_problems()
    if found:
        logging.getLogger("vllm.seqhooks").error(
            "vllm-seqhooks: no splice joins on the V2 runner: %s", "; ".join(found))
        return False
    if getattr(V2Runner.prepare_attn, _SPLICE_MARK, False):
        return True
    prepare_inputs, prepare_attn = V2Runner.prepare_inputs, V2Runner.prepare_attn

    def wrapped_prepare_inputs(self, scheduler_output, *args, **kwargs):
        # (prepare_attn, which computes the slot mappings, is not given it)
        self.__dict__[_STEP_SHIFTS] = _copy_kv_for(self, scheduler_output)
        return prepare_inputs(self, scheduler_output, *args, **kwargs)

    def wrapped_prepare_attn(self, input_batch):
        out = prepare_attn(self, input_batch)
        shifts = self.__dict__.pop(_STEP_SHIFTS, None)
        if shifts:
            index = {rid: i for i, rid in enumerate(input_batch.req_ids)}
            _shift_positions(input_batch.positions, index.get,
                             input_batch.query_start_loc_np, shifts)
        return out

    wrap_method(V2Runner, "prepare_inputs", wrapped_prepare_inputs, _SPLICE_MARK)
    wrap_method(V2Runner, "prepare_attn", wrapped_prepare_attn, _SPLICE_MARK)
    return True
