"""Calls of vLLM's private ``Scheduler`` methods that the engine's parts
make outside the scheduler's overrides, one function each, named for what it
does (signatures checked at start-up: ``SCHEDULER_METHODS`` in
:mod:`.scheduler`). Parking's calls are in :mod:`.sessions`."""

from __future__ import annotations

from typing import Any, Callable

from vllm_seqhooks.engine.vllm_private.releases import installed


def preempt(sched: Any, request: Any, timestamp: float) -> None:
    """Preempt a running ``request`` that the caller took out of
    ``running`` (its blocks freed; it waits, to be recomputed)."""
    sched._preempt_request(request, timestamp)


def free_blocks_to_prefix_cache(sched: Any, request: Any) -> None:
    """Give a parked ``request``'s KV blocks back to the pool: its full
    blocks stay in the prefix cache until evicted."""
    sched._free_request_blocks(request)


def free_held_blocks(sched: Any, request: Any) -> None:
    """Free the blocks of a finished ``request`` whose freeing vLLM was told
    to delay (``_free_request(..., delay_free_blocks=True)``)."""
    sched._free_blocks(request)


def vllm_request_update(base: Any) -> Callable[..., tuple[list[int], bool]]:
    """vLLM's own ``_update_request_with_output`` of ``base`` (``super()``
    seen from the hook scheduler), bound once."""
    return base._update_request_with_output


def count_as_rejected(request: Any, num_tokens: int) -> None:
    """Roll back the bookkeeping of ``num_tokens`` sampled tokens that will
    not be kept, as vLLM's ``update_from_output`` does for rejected drafts."""
    if request.num_computed_tokens > 0:
        request.num_computed_tokens -= num_tokens
    if request.num_output_placeholders > 0:
        request.num_output_placeholders -= num_tokens


def request_update_for_hooks(base: Any) -> Callable[..., tuple[list[int], bool]]:
    """vLLM's own ``_update_request_with_output`` of ``base`` for the hook
    path, the same on every release: the tokens vLLM cut after a stop are
    not counted computed afterwards (a parked request resumes from its
    computed tokens). 0.33 takes them back itself
    (``Release.rolls_back_cut_at_stop``); on 0.32 this does, as vLLM does
    for rejected drafts."""
    update = base._update_request_with_output
    if installed().rolls_back_cut_at_stop:
        return update

    def update_rolling_back(request: Any, new_token_ids: list[int],
                            is_stale: bool = False) -> tuple[list[int], bool]:
        offered = len(new_token_ids)
        kept, stopped = update(request, new_token_ids, is_stale)
        if stopped and len(kept) < offered and not is_stale:
            count_as_rejected(request, offered - len(kept))
        return kept, stopped

    return update_rolling_back


def bind_stock_request_updates(sched: Any, base: Any) -> None:
    """From now on ``sched``'s ``_update_request_with_output`` (which only
    vLLM's ``update_from_output`` calls) is ``base``'s, vLLM's own
    (``base``: ``super()`` seen from the hook scheduler): steps in which no
    request has hook work cost what they cost stock vLLM (no override in the
    per-request loop). ``base`` None: the hook scheduler's override again."""
    if base is None:
        del sched._update_request_with_output
    else:
        sched._update_request_with_output = base._update_request_with_output
