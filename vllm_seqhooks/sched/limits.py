"""Family limits applied: the ledger of :mod:`vllm_seqhooks.family` decides,
this mixin refuses promises, trims what descendants sample to the family's
token budget, and cuts families and children that ran out of tokens or
time."""

from __future__ import annotations

import logging
import time
from typing import Iterable

from vllm.v1.request import Request, RequestStatus

from vllm_seqhooks.dependencies import FAILED, FINISHED
from vllm_seqhooks.family import CHILD_TIMEOUT, DEADLINE, FamilyLedger, family_limits
from vllm_seqhooks.sched.state import HookState

# Under vLLM's "vllm" logger: same handlers, format and VLLM_LOGGING_LEVEL.
logger = logging.getLogger("vllm.seqhooks.scheduler")

#: Finish reason of a child cut because its family stopped.
CUT_REASON = "length"


class LimitsMixin:
    """Family token budgets, descendant and live-children limits, deadlines."""

    #: Wall clock of deadlines (vLLM's arrival times are time.time()).
    _clock = staticmethod(time.time)

    def _new_family(self, request: Request, per_request: dict) -> FamilyLedger:
        hooks = self.hooks
        limits = family_limits(
            max_tokens=request.max_tokens,
            max_children_per_request=hooks.max_children_per_request,
            token_factor=hooks.family_token_factor,
            max_descendants=hooks.max_descendants,
            max_live_children=hooks.max_live_children_per_family,
            per_request=per_request,
            timeout_s=hooks.family_timeout_s,
            child_timeout_s=hooks.child_timeout_s,
        )
        ledger = FamilyLedger(request.request_id, limits, started=request.arrival_time)
        self._families[request.request_id] = ledger
        return ledger

    def _limit_refusal(self, st: HookState) -> str | None:
        family = st.family
        if family is None:
            return None
        return family.spawn_refusal(len(self._children), self.hooks.max_live_children)

    def _child_spawned(self, family: FamilyLedger | None, child_id: str) -> None:
        if family is None:
            return
        family.spawned()
        cst = self._hook_states.get(child_id)
        if cst is not None:
            cst.family = family
        deadline = family.child_deadline(self._clock())
        if deadline is not None:
            self._child_deadlines[child_id] = deadline

    def _family_child_ended(self, st: HookState | None, rid: str) -> None:
        self._child_deadlines.pop(rid, None)
        if st is not None and st.family is not None:
            st.family.child_ended()

    # ------------------------------------------------------------- tokens
    def _tokens_allowed(self, st: HookState, offered: int) -> int:
        """How many sampled tokens a descendant keeps (all, for a request
        that is not a descendant)."""
        family = st.family
        if family is None or st.request.request_id not in self._children:
            return offered
        if family.exhausted_by is not None:
            return 0
        return family.allowed(offered)

    def _charge(self, st: HookState, kept: int) -> None:
        family = st.family
        if family is None or st.request.request_id not in self._children:
            return
        if family.charge(kept):
            logger.info("%s: family token budget (%d tokens for descendants) "
                        "spent; cutting its descendants", family.root_id,
                        family.limits.descendant_budget)
            self._families_to_cut.append(family)

    def _stops_family_member(self, st: HookState) -> bool:
        """True when this request must stop now because its family stopped:
        any descendant, and the request itself past the family deadline."""
        family = st.family
        if family is None or family.exhausted_by is None:
            return False
        return (st.request.request_id in self._children
                or family.exhausted_by == DEADLINE)

    # ---------------------------------------------------------- enforcing
    def _enforce_limits(self) -> None:
        """At each step: cut families that ran out, fail children past
        their deadline."""
        if self._child_deadlines or self._timed_families:
            now = self._clock()
            for family in list(self._timed_families):
                if family.expire(now):
                    logger.info("%s: family timeout (%.3fs) passed; cutting its "
                                "descendants", family.root_id, family.limits.timeout_s)
                    self.metrics.inc("family_deadlines", 1)
                    self._families_to_cut.append(family)
            expired = [rid for rid, t in self._child_deadlines.items() if t <= now]
            if expired:
                self._time_out(expired)
        while self._families_to_cut:
            self._cut(self._families_to_cut.pop())

    def _time_out(self, child_ids: list[str]) -> None:
        for rid in child_ids:
            self._child_deadlines.pop(rid, None)
            st = self._hook_states.get(rid)
            if st is not None and st.family is not None:
                st.family.timed_out_children += 1
            logger.info("%s: child timeout passed; it fails and its parent "
                        "resumes", rid)
        self.metrics.inc("child_timeouts", len(child_ids))
        self._end_children(child_ids, RequestStatus.FINISHED_ABORTED, FAILED, CHILD_TIMEOUT)

    def _cut(self, family: FamilyLedger) -> None:
        """End the family's live descendants as if they had reached their
        ``max_tokens``; parked ones join (and finish) when theirs end."""
        live = []
        for rid in self.deps.live_descendants(family.root_id):
            st = self._hook_states.get(rid)
            if rid in self._children and not (st is not None and st.parked):
                live.append(rid)
        if not live:
            return
        family.cut_children += len(live)
        self.metrics.inc("children_cut", len(live))
        self._end_children(live, RequestStatus.FINISHED_LENGTH_CAPPED, FINISHED, CUT_REASON)

    def _end_children(self, child_ids: Iterable[str], status: RequestStatus,
                      state: str, reason: str) -> None:
        """Finish live children (and their subtrees) from inside the
        scheduler: they end with ``state``; a parent parked on them joins."""
        finished = super().finish_requests(self.deps.with_subtrees(child_ids), status)
        for req in finished:
            if req.request_id in self._children:
                self._child_ended(req, state, reason)
        self._publish_metrics()
