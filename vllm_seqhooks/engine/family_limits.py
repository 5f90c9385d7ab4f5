"""Family limits applied: the ledger of :mod:`vllm_seqhooks.core.family_limits`
decides; this part refuses promises, trims what descendants sample to the
family's token budget, and cuts families and children that ran out of tokens
or time."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Iterator

from vllm.v1.request import Request, RequestStatus

from vllm_seqhooks.core.family_limits import CHILD_TIMEOUT, DEADLINE, FamilyLedger, family_limits
from vllm_seqhooks.core.family_limits import FamilyLimits as Limits
from vllm_seqhooks.config.special_kwargs import SpecialKwargs
from vllm_seqhooks.core.request_tree import FAILED, FINISHED
from vllm_seqhooks.engine.agreed_clock import AgreedClock
from vllm_seqhooks.engine.metrics import HookMetrics
from vllm_seqhooks.engine.state import ForkJoinState, HookState

# Under vLLM's "vllm" logger: same handlers, format and VLLM_LOGGING_LEVEL.
logger = logging.getLogger("vllm.seqhooks.scheduler")

#: Finish reason of a child cut because its family stopped.
CUT_REASON = "length"
#: How many distinct (max_tokens, per-request settings) families' limits
#: are kept before the cache starts again.
LIMITS_KEPT = 256


@dataclass(frozen=True)
class ChildrenCut:
    """Live children to end now (with their subtrees), as ``status`` and
    ``outcome``, for ``reason``: decided by :meth:`FamilyLimits.enforce`,
    applied by the scheduler (``end_children``)."""

    child_ids: list[str]
    status: RequestStatus
    outcome: str
    reason: str


class FamilyLimits:
    """Family token budgets, descendant and live-children limits, deadlines."""

    #: Wall clock of deadlines (vLLM's arrival times are time.time()).
    clock = staticmethod(time.time)

    def __init__(self, fork_join: ForkJoinState, hooks: SpecialKwargs, metrics: HookMetrics,
                 spmd: bool) -> None:
        self.fork_join = fork_join
        self.hooks = hooks
        self.metrics = metrics
        #: A clock reading as every rank sees it (the latest of theirs on an
        #: SPMD engine, whose ranks must take the same decisions).
        self.agree = _as_is
        self._kept_limits: dict[tuple, Limits] = {}
        if spmd:
            agreed = AgreedClock()
            self.clock, self.agree = agreed, agreed.agree

    def new_family(self, request: Request, per_request: dict) -> FamilyLedger:
        limits = self._limits(request.max_tokens, per_request)
        started = request.arrival_time
        if limits.timeout_s is not None:  # (its deadline runs from there)
            started = self.agree(started)
        ledger = FamilyLedger(request.request_id, limits, started=started)
        fj = self.fork_join
        fj.families[request.request_id] = ledger
        if ledger.deadline is not None:
            fj.timed_families.add(ledger)
        return ledger

    def _limits(self, max_tokens: int, per_request: dict) -> Limits:
        """The limits of a family whose root asks ``max_tokens`` with
        ``per_request``'s keys (kept: most families ask alike)."""
        key = (max_tokens, *per_request.items())
        limits = self._kept_limits.get(key)
        if limits is None:
            if len(self._kept_limits) >= LIMITS_KEPT:
                self._kept_limits.clear()
            hooks = self.hooks
            limits = self._kept_limits[key] = family_limits(
                max_tokens=max_tokens,
                max_children_per_request=hooks.max_children_per_request,
                token_factor=hooks.family_token_factor,
                max_descendants=hooks.max_descendants,
                max_live_children=hooks.max_live_children_per_family,
                per_request=per_request,
                timeout_s=hooks.family_timeout_s,
                child_timeout_s=hooks.child_timeout_s,
            )
        return limits

    # ------------------------------------------------------------ spawning
    def refusal(self, st: HookState) -> str | None:
        """Why the request's next promise may not spawn (None: it may).
        Settles the family's deferred charges (a new child's budget is
        read from what is left right after)."""
        family = st.family
        if family is None:
            return None
        self.settle(family)
        return family.spawn_refusal(len(self.fork_join.children),
                                    self.hooks.max_live_children)

    def child_spawned(self, family: FamilyLedger | None, child_id: str) -> None:
        if family is None:
            return
        fj = self.fork_join
        family.spawned()
        cst = fj.states.get(child_id)
        if cst is not None:
            cst.family = cst.charged_to = family
            self._defer_or_charge(family, cst)
        if family.limits.child_timeout_s is not None:
            fj.child_deadlines[child_id] = family.child_deadline(self.clock())

    def _defer_or_charge(self, family: FamilyLedger, cst: HookState) -> None:
        """A new descendant's charges are deferred while every live
        descendant's budget fits in what the family has left (none can be
        trimmed or spend the budget: they sample without per-step
        charging); else every descendant is charged as it samples."""
        fj = self.fork_join
        self.settle(family)
        others = (fj.states.get(rid) for rid in family.deferred)
        remaining = cst.orig_max_tokens + sum(
            max(0, s.orig_max_tokens - s.sampled) for s in others if s is not None)
        if family.fits(remaining):
            family.deferred.add(cst.request.request_id)
            cst.charge_deferred = True
            fj.refresh_quiet(cst)
            return
        family.pressured = True
        for rid in family.deferred:
            s = fj.states.get(rid)
            if s is not None:
                s.charge_deferred = False
                fj.set_quiet(s, None)
        family.deferred.clear()
        fj.set_quiet(cst, None)

    def settle(self, family: FamilyLedger) -> None:
        """Charge what the family's deferred descendants sampled so far."""
        states = self.fork_join.states
        for rid in family.deferred:
            st = states.get(rid)
            if st is not None:
                self._settle_one(st)

    def _settle_one(self, st: HookState) -> None:
        sampled = st.sampled
        if sampled > st.charged_upto:
            self._charge_family(st.charged_to, sampled - st.charged_upto)
            st.charged_upto = sampled

    def child_ended(self, st: HookState | None, rid: str) -> None:
        self.fork_join.child_deadlines.pop(rid, None)
        if st is not None and st.family is not None:
            if st.charge_deferred:
                self._settle_one(st)
                st.family.deferred.discard(rid)
                st.charge_deferred = False
            st.family.child_ended()

    # -------------------------------------------------------------- tokens
    def trim_to_budget(self, st: HookState, new_token_ids: list[int]) -> bool:
        """Drop the tokens a descendant sampled past its family's budget;
        True when some were dropped."""
        if not st.charged_per_step:
            return False
        family = st.charged_to
        offered = len(new_token_ids)
        allowed = 0 if family.exhausted_by is not None else family.allowed(offered)
        if allowed < offered:
            del new_token_ids[allowed:]
            return True
        return False

    def charge(self, st: HookState, kept: int) -> None:
        if st.charged_per_step:
            self._charge_family(st.charged_to, kept)

    def _charge_family(self, family: FamilyLedger, kept: int) -> None:
        if family.charge(kept):
            logger.info("%s: family token budget (%d tokens for descendants) "
                        "spent; cutting its descendants", family.root_id,
                        family.limits.descendant_budget)
            self.fork_join.families_to_cut.append(family)

    def stops_member(self, st: HookState) -> bool:
        """True when this request must stop now because its family stopped:
        any descendant, and the request itself past the family deadline."""
        family = st.family
        if family is None or family.exhausted_by is None:
            return False
        return st.charged_to is not None or family.exhausted_by == DEADLINE

    # ---------------------------------------------------------- enforcing
    def enforce(self) -> Iterator[ChildrenCut]:
        """At each step: cut families that ran out, fail children past
        their deadline; each cut is applied by the caller before the next
        is decided (a child it ended is not cut again)."""
        fj = self.fork_join
        if fj.child_deadlines or fj.timed_families:
            now = self.clock()
            for family in list(fj.timed_families):
                if family.expire(now):
                    root = fj.states.get(family.root_id)
                    if root is not None:
                        fj.set_quiet(root, None)  # it stops at its next step
                    logger.info("%s: family timeout (%.3fs) passed; cutting its "
                                "descendants", family.root_id, family.limits.timeout_s)
                    self.metrics.inc("family_deadlines", 1)
                    fj.families_to_cut.append(family)
            expired = [rid for rid, t in fj.child_deadlines.items() if t <= now]
            if expired:
                yield self._time_out(expired)
        while fj.families_to_cut:
            cut = self._cut(fj.families_to_cut.pop())
            if cut is not None:
                yield cut

    def _time_out(self, child_ids: list[str]) -> ChildrenCut:
        fj = self.fork_join
        for rid in child_ids:
            fj.child_deadlines.pop(rid, None)
            st = fj.states.get(rid)
            if st is not None and st.family is not None:
                st.family.timed_out_children += 1
            logger.info("%s: child timeout passed; it fails and its parent "
                        "resumes", rid)
        self.metrics.inc("child_timeouts", len(child_ids))
        return ChildrenCut(child_ids, RequestStatus.FINISHED_ABORTED, FAILED, CHILD_TIMEOUT)

    def _cut(self, family: FamilyLedger) -> ChildrenCut | None:
        """End the family's live descendants as if they had reached their
        ``max_tokens``; parked ones join (and finish) when theirs end."""
        fj = self.fork_join
        live = []
        for rid in fj.tree.live_descendants(family.root_id):
            st = fj.states.get(rid)
            if rid in fj.children and not (st is not None and st.parked):
                live.append(rid)
        if not live:
            return None
        family.cut_children += len(live)
        self.metrics.inc("children_cut", len(live))
        return ChildrenCut(live, RequestStatus.FINISHED_LENGTH_CAPPED, FINISHED, CUT_REASON)


def _as_is(reading: float) -> float:
    return reading
