"""Several sampled tokens a step (speculative decoding): they are cut at a
``<sync>`` or fork tag that parks the request, or at the end tag that ends a
child, before vLLM appends them."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from vllm.v1.request import Request

from vllm_seqhooks.engine.state import ForkJoinState, HookState
from vllm_seqhooks.engine.vllm_private import count_as_rejected
from vllm_seqhooks.formats.events import EndTagReached, ForkReached, PayloadClosed, SyncReached

if TYPE_CHECKING:
    from vllm_seqhooks.engine.spawning import Spawning

# Under vLLM's "vllm" logger: same handlers, format and VLLM_LOGGING_LEVEL.
logger = logging.getLogger("vllm.seqhooks.scheduler")


class Speculative:
    """Cuts a step's tokens after the tag that stops the request (asking
    ``spawning`` whether a payload or fork would spawn)."""

    def __init__(self, fork_join: ForkJoinState, spawning: "Spawning") -> None:
        self.fork_join = fork_join
        self.spawning = spawning

    def cut_after_parking_tag(self, st: HookState, new_token_ids: list[int],
                              is_stale: bool) -> None:
        """Drop the tokens after a ``<sync>`` or fork tag that will park the
        request (or an end tag that ends it) before vLLM appends them,
        checks them for a stop, or caches blocks holding them. The parent
        resumes after the merge; the dropped tokens count as rejected drafts
        (vLLM's own rollback of ``num_computed_tokens`` and, under async
        scheduling, of the output placeholders)."""
        cut = self._stopping_offset(st, new_token_ids)
        if cut is None:
            return
        drop = len(new_token_ids) - cut - 1
        if drop <= 0:
            return
        del new_token_ids[cut + 1:]
        if not is_stale:
            count_as_rejected(st.request, drop)
        logger.debug("%s: %d tokens sampled after <sync> dropped", st.request.request_id, drop)

    def _stopping_offset(self, st: HookState, new_token_ids: list[int]) -> int | None:
        """Index in ``new_token_ids`` of the first ``<sync>`` that parks the
        request (it has open children then, counting those that payloads
        closing earlier in the same tokens will spawn), fork tag that
        spawns, or end tag; None when there is none. Changes nothing: it
        scans with a copy of the request's scanner."""
        scanner = st.scanner
        if scanner is None or not scanner.may_fire(new_token_ids):
            return None
        spawning = self.spawning
        start = st.request.num_tokens
        has_children = self.fork_join.tree.has_open_children(st.request.request_id)
        for ev in st.scan(new_token_ids, start, scanner.copy()):
            if isinstance(ev, PayloadClosed):
                has_children = has_children or spawning.spawn_refusal(st, ev) is None
            elif isinstance(ev, SyncReached) and has_children:
                return ev.pos - start
            elif isinstance(ev, ForkReached) and spawning.fork_refusal(st, ev) is None:
                return ev.pos - start
            elif isinstance(ev, EndTagReached):
                return ev.pos - start
        return None

    def drop_parked_drafts(self, draft_token_ids) -> None:
        """The drafter proposed for every request of the step, the parent
        that just parked included; its drafts continue text that the merge
        will replace, and would be scheduled (and verified for nothing)
        when it resumes."""
        states = self.fork_join.states
        for rid in draft_token_ids.req_ids:
            st = states.get(rid)
            if st is not None and st.parked:
                st.request.spec_token_ids = []
