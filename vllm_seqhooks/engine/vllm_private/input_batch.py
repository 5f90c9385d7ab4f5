"""The V1 model runner's persistent batch (``InputBatch``), permuted in one
pass.

``InputBatch.swap_states(i, j)`` exchanges two rows: about 30 fields, ~13 µs
a pair on a 2-core CPU. Grouping 64 families after a step in which 16 of
them each gained a child needs 30-200 such pairs (``benchmarks.step --workload engine``).
:func:`permute_input_batch` makes
the same change to every moved row at once and records the same pairs in
``batch_update_builder.moved`` (what the logits processors replay), so that
what the model, the sampler and the logits processors read afterwards is
what the pairs would have left, with one numpy operation per field.

It reproduces the pinned vLLM's ``swap_states``: the sources it follows are
pinned by digest (:data:`PINNED_SOURCES`), and the fields it moves must be
made by ``InputBatch.__init__``; on any other source (another vLLM,
or a runner whose batch overrides them) it warns once and exchanges the
pairs with ``swap_states`` itself. ``tests/test_input_batch_permute.py``
checks every field of a real batch against ``swap_states``.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
from collections import deque

import numpy as np

from vllm_seqhooks.core.batch_order import Moves, moves_as_swaps

#: sha256 (first 16 hex digits) of the sources whose effect the one-pass
#: permutation reproduces, in the pinned vLLM.
PINNED_SOURCES = {
    "swap_states": "ade3800da76a67b6",
    "_get_active_token_count": "30325a6e4e6d2289",
    "BlockTable.swap_row": "3088fdbf2fb80dbb",
    "MultiGroupBlockTable.swap_row": "7de94bf9e08fe268",
}
#: Lists with one entry per row (request ids, output tokens, draft tokens).
ROW_LISTS = ("_req_ids", "req_output_token_ids", "spec_token_ids")
#: Arrays with one entry per row.
ROW_ARRAYS = ("num_tokens_no_spec", "num_prompt_tokens", "num_computed_tokens_cpu",
              "request_lora_mapping")
#: Arrays with one token row per request: only the active prefix moves.
TOKEN_ROWS = ("token_ids_cpu", "is_token_ids")
#: Dicts keyed by row, holding entries only for some rows.
ROW_DICTS = ("req_prompt_embeds",)
#: What only a generating (not a pooling) model's batch exchanges.
SAMPLING_ROW_ARRAYS = ("temperature_cpu", "top_p_cpu", "top_k_cpu", "frequency_penalties_cpu",
                       "presence_penalties_cpu", "repetition_penalties_cpu",
                       "num_accepted_tokens_cpu")
SAMPLING_ROW_DICTS = ("generators", "bad_words_token_ids")
#: The fewest moved rows (two swaps) for which one pass costs less than
#: swap_states pair by pair.
ONE_PASS_FROM = 3

_verdict: dict[type, bool] = {}


def input_batch_problems(batch_cls: type | None = None) -> list[str]:
    """How ``batch_cls`` (vLLM's InputBatch by default) differs from what the
    one-pass permutation reproduces (empty when it may be used)."""
    from vllm.v1.worker.block_table import BlockTable, MultiGroupBlockTable
    from vllm.v1.worker.gpu_input_batch import InputBatch

    batch_cls = batch_cls or InputBatch
    sources = {
        "swap_states": getattr(batch_cls, "swap_states", None),
        "_get_active_token_count": getattr(batch_cls, "_get_active_token_count", None),
        "BlockTable.swap_row": BlockTable.swap_row,
        "MultiGroupBlockTable.swap_row": MultiGroupBlockTable.swap_row,
    }
    found = []
    for name, fn in sources.items():
        got = _digest(fn) if fn is not None else "missing"
        if got != PINNED_SOURCES[name]:
            found.append(f"{batch_cls.__name__} {name}: source {got}, pinned "
                         f"{PINNED_SOURCES[name]}")
    init = inspect.getsource(InputBatch.__init__)
    for name in (*ROW_LISTS, *ROW_ARRAYS, *TOKEN_ROWS, *ROW_DICTS, *SAMPLING_ROW_ARRAYS,
                 *SAMPLING_ROW_DICTS, "req_id_to_index", "allowed_token_ids_mask_cpu_tensor"):
        if f"self.{name}" not in init:
            found.append(f"InputBatch no longer has {name}")
    return found


def permute_input_batch(batch, moves: Moves, max_drafts: int | None = None) -> None:
    """Apply ``moves`` (row ``dst[k]`` takes row ``src[k]``) to ``batch``
    as the pairs :func:`moves_as_swaps` lists would, with ``swap_states``.
    ``max_drafts``: the most draft tokens a row holds (the runner's
    ``num_spec_tokens``); None: read from the moved rows."""
    allowed = _verdict.get(type(batch))
    if allowed is None:
        allowed = _one_pass_allowed(type(batch))
    to_rows, from_rows = moves
    if len(to_rows) < ONE_PASS_FROM or not allowed:
        for i, j in moves_as_swaps(moves):
            batch.swap_states(i, j)
        return
    # swap_states copies each pair's longer active prefix (prompt, output
    # and draft tokens): here the longest of the moved rows (or more).
    if max_drafts is None:
        max_drafts = max(map(len, map(batch.spec_token_ids.__getitem__, from_rows)))
    _permute_rows(batch, moves, max_drafts)


def check_one_pass(batch_cls: type | None = None) -> bool:
    """Whether ``batch_cls`` (vLLM's InputBatch by default) may be permuted
    in one pass; decided once per class, logging why not."""
    if batch_cls is None:
        from vllm.v1.worker.gpu_input_batch import InputBatch

        batch_cls = InputBatch
    return _one_pass_allowed(batch_cls)


def _one_pass_allowed(batch_cls: type) -> bool:
    allowed = _verdict.get(batch_cls)
    if allowed is None:
        found = input_batch_problems(batch_cls)
        if found:
            logging.getLogger("vllm.seqhooks").warning(
                "vllm-seqhooks: grouping families in the batch pair by pair (slower): %s",
                "; ".join(found))
        allowed = _verdict[batch_cls] = not found
    return allowed


def _permute_rows(batch, moves: Moves, max_drafts: int) -> None:
    """Every moved row's fields, one numpy operation (or list pass) per field."""
    to_rows, from_rows = moves
    pooling = batch.is_pooling_model
    dst, src = np.array(to_rows), np.array(from_rows)
    width = int(batch.num_tokens_no_spec[src].max()) + max_drafts
    for name in TOKEN_ROWS:
        rows = getattr(batch, name)
        rows[dst, :width] = rows[src, :width]
    for name in ROW_LISTS:
        _permute_list(getattr(batch, name), to_rows, from_rows)
    ids = batch._req_ids
    batch.req_id_to_index.update(zip(map(ids.__getitem__, to_rows), to_rows))
    for array in _row_arrays(batch, pooling):
        _permute_array(array, dst, src)
    for values in _row_dicts(batch, pooling):
        _permute_dict(values, to_rows, from_rows)
    if pooling:
        return
    swap = _SWAP if _SWAP is not None else _swap_tag()
    batch.batch_update_builder.moved.extend([(i, j, swap) for i, j in moves_as_swaps(moves)])
    if batch.allowed_token_ids_mask_cpu_tensor is not None:
        _permute_mask(batch, to_rows, from_rows)


def _permute_mask(batch, to_rows: list[int], from_rows: list[int]) -> None:
    """The allowed-token mask (a torch tensor, present when a request
    restricts its tokens)."""
    mask = batch.allowed_token_ids_mask_cpu_tensor
    mask[to_rows] = mask[from_rows]


_SWAP = None


def _swap_tag():
    """What the logits processors' record of moved rows calls a swap."""
    global _SWAP
    from vllm.v1.sample.logits_processor.interface import MoveDirectionality

    _SWAP = MoveDirectionality.SWAP
    return _SWAP


def _row_dicts(batch, pooling: bool) -> list[dict]:
    """The dicts keyed by row (entries for some rows only)."""
    names = ROW_DICTS if pooling else (*ROW_DICTS, *SAMPLING_ROW_DICTS)
    return [getattr(batch, name) for name in names]


def _row_arrays(batch, pooling: bool) -> list:
    """The arrays whose rows move whole: one entry per row, and each block
    table's rows."""
    arrays = [getattr(batch, name) for name in ROW_ARRAYS]
    if batch.use_replayssm:
        arrays.append(batch.replayssm_decode_base)
    for table in batch.block_table.block_tables:
        arrays += (table.num_blocks_per_row, table.block_table.np)
    if not pooling:
        arrays += (getattr(batch, name) for name in SAMPLING_ROW_ARRAYS)
    return arrays


def _permute_array(array, dst, src) -> None:
    array[dst] = array[src]


def _permute_list(values: list, to_rows: list[int], from_rows: list[int]) -> None:
    deque(map(values.__setitem__, to_rows, list(map(values.__getitem__, from_rows))), maxlen=0)


def _permute_dict(values: dict, to_rows: list[int], from_rows: list[int]) -> None:
    if not values:
        return
    moved = [values.get(i) for i in from_rows]
    for i, value in zip(to_rows, moved):
        if value is None:
            values.pop(i, None)
        else:
            values[i] = value


def _digest(fn) -> str:
    return hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()[:16]
