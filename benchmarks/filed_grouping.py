"""The V1 family grouping as it ran when issue 20 was filed: the baseline of
its goal "the runner-side reorder ≤ 10 % of its cost today".

Then (commit 96f96f9, ``core/batch_order.grouping_swaps`` and
``vllm_private.install_family_batch_order``) the runner's wrapper, before
every step, read every id of the batch, computed the order that puts the
families in the order of their first member (members in their order) and
applied it with vLLM's ``InputBatch.swap_states``, one pair of rows at a
time. Rewritten here from that commit so that ``benchmarks.engine_step`` can
time it beside today's grouping in the same run.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from contextlib import contextmanager
from typing import Any

from vllm_seqhooks.core.batch_order import family_of


def grouping_swaps_as_filed(request_ids: Sequence[str]) -> list[tuple[int, int]]:
    """Swaps ``(i, j)``, applied in order, that make every family of
    ``request_ids`` contiguous: families in the order of their first member,
    members in their order (empty when they already are)."""
    groups: dict[str, list[int]] = {}
    for index, rid in enumerate(request_ids):
        groups.setdefault(family_of(rid), []).append(index)
    if len(groups) == len(request_ids):
        return []
    target = [index for members in groups.values() for index in members]
    at = list(range(len(request_ids)))  # position -> original index now there
    where = list(range(len(request_ids)))  # original index -> its position
    swaps: list[tuple[int, int]] = []
    for pos, wanted in enumerate(target):
        src = where[wanted]
        if src == pos:
            continue
        displaced = at[pos]
        swaps.append((pos, src))
        at[pos], at[src] = wanted, displaced
        where[wanted], where[displaced] = pos, src
    return swaps


def _reorder_as_filed(runner: Any, vllm_reorder: Any, scheduler_output: Any) -> Any:
    batch = runner.input_batch
    for i, j in grouping_swaps_as_filed(batch.req_ids[: batch.num_reqs]):
        batch.swap_states(i, j)
    return vllm_reorder(runner, scheduler_output)


@contextmanager
def grouping_as_filed(runner: Any, probe: Any):
    """Within the block, ``runner`` groups its batch as it did when issue 20
    was filed, timed by ``probe`` as its own reorder is (the same wrapper);
    afterwards the runner's own (timed) reorder is back."""
    timed_own = runner.__dict__.get("_may_reorder_batch")
    if timed_own is None:
        raise RuntimeError("the runner's reorder is not timed by the probe")
    ours = type(runner)._may_reorder_batch
    if not getattr(ours, "_seqhooks_family_order", False):
        raise RuntimeError("the family grouping is not installed in this runner's class")
    vllm_reorder = ours.__wrapped__  # vLLM's own reorder
    runner._may_reorder_batch = functools.partial(_reorder_as_filed, runner, vllm_reorder)
    probe._add_timer(runner, "_may_reorder_batch", "reorder_s")
    try:
        yield
    finally:
        runner._may_reorder_batch = timed_own
