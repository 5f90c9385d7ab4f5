"""What the fork/join scheduler keeps: per request (:class:`HookState`) and
for the whole engine (:class:`ForkJoinState`), each defined once."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm_seqhooks.core.fair_share import StepShare
from vllm_seqhooks.core.family_limits import FamilyLedger
from vllm_seqhooks.core.request_tree import JoinRecord, RequestTree
from vllm_seqhooks.engine.lifecycle import WAITING_FOR_CHILDREN, Lifecycle, Phase
from vllm_seqhooks.formats.events import ForkReached, HookScanner

if TYPE_CHECKING:
    from vllm.v1.engine import EngineCoreOutput
    from vllm.v1.request import Request, RequestStatus


@dataclass(slots=True)
class HookState:
    """What the scheduler keeps for one request with hooks."""

    request: Request
    scanner: HookScanner | None
    orig_prompt_len: int
    orig_max_tokens: int
    orig_min_tokens: int
    #: Tokens it sampled before its current vLLM segment (its last resume).
    sampled_before: int = 0
    #: Set while the request is parked because it finished with open
    #: children: the status it finishes with once they are merged.
    final_status: RequestStatus | None = None
    final_stop_reason: int | str | None = None
    #: Position of the token that stopped the request (EOS / stop token).
    stop_pos: int | None = None
    #: Where it is in its fork/join life; changed only by
    #: :class:`~vllm_seqhooks.engine.lifecycle.Lifecycle`'s transitions.
    phase: Phase = Phase.RUNNING
    #: Set while it is SPILLED (its KV blocks given back, or preempted at
    #: its stop), by the lifecycle only: how far its KV had reached.
    spilled_frontier: int | None = None
    #: When it parked (``time.time()``), while it waits for its children;
    #: set by the lifecycle only.
    parked_since: float | None = None
    #: The join whose prefill is being counted, until the parent samples.
    accounting: JoinRecord | None = None
    first_scheduled: bool = False
    preempted_at_stop: bool = False
    child_max_tokens: int | None = None
    separator: tuple[int, ...] = ()
    #: The limits of the family this request belongs to (None: no limits,
    #: the request cannot spawn).
    family: FamilyLedger | None = None
    #: The ledger this request's sampled tokens are charged to: its
    #: family's, for a descendant (a request's own tokens are not charged).
    charged_to: FamilyLedger | None = None
    #: Its charges are settled later (``FamilyLedger.deferred``), and how
    #: many of its sampled tokens are charged so far.
    charge_deferred: bool = False
    charged_upto: int = 0
    #: A child of a tag format that stopped at its end tag.
    ended_by_tag: bool = False
    #: The fork a tag format's request is parked at: its tag's last token
    #: is held back from the client and replaced at the join
    #: (:mod:`vllm_seqhooks.formats.boundaries`).
    fork: ForkReached | None = None
    #: A child ended without its end tag since the last join (the format's
    #: ``unclosed_child_stop_text`` then ends this parent at the join).
    unclosed_child: bool = False
    #: While not None, a step whose sampled tokens are all outside this set
    #: needs no hook work: nothing to cut, charge, count or scan. None:
    #: every step is looked at. Set through ``ForkJoinState.set_quiet``.
    quiet_ids: frozenset[int] | None = None
    #: Its stop needs hook work even in a quiet step: it parks (open
    #: children) or closes its open payload (``HookScanner.pending_finish``).
    #: Set by ``ForkJoinState.refresh_quiet``.
    watch_stop: bool = False

    def scan(self, tokens: list[int], start: int, scanner: HookScanner | None = None):
        """Events of ``tokens`` (the first at ``start``) from ``scanner``
        (default: its own), fed first what quiet steps left unscanned since
        it was last fed, when it needs them (``needs_history``)."""
        scanner = self.scanner if scanner is None else scanner
        if scanner.needs_history:
            fed = scanner.fed_to
            if fed is not None and fed < start:
                tokens = [*self.request.all_token_ids[fed:start], *tokens]
                start = fed
        return scanner.feed(tokens, start)

    @property
    def parked(self) -> bool:
        """It waits for its children (parking or parked, spilled or not)."""
        return self.phase in WAITING_FOR_CHILDREN

    @property
    def draining(self) -> bool:
        """A splice join's child that wrote its end tag: it computes the
        tag's KV in one more step, whose sampled token is dropped."""
        return self.phase is Phase.DRAINING

    @property
    def sampled(self) -> int:
        """Tokens it sampled and kept, in all (vLLM's output tokens are
        those of its current segment)."""
        return self.sampled_before + self.request.num_output_tokens

    @property
    def charged_per_step(self) -> bool:
        """Its sampled tokens are charged to its family as it samples."""
        return self.charged_to is not None and not self.charge_deferred


@dataclass
class DeferredChild:
    """A tag format's child waiting for room under the live-children limits
    (its node is in the tree already, so its parent waits for it)."""

    parent_id: str
    child_id: str
    prompt: list[int]
    #: Position of the parent's token that closed the fork.
    closed_at: int


@dataclass(eq=False)
class ForkJoinState:
    """Everything the scheduler keeps for fork/join, across requests."""

    tree: RequestTree = field(default_factory=RequestTree)
    #: Per-request state of every request with hooks.
    states: dict[str, HookState] = field(default_factory=dict)
    #: Live child requests (their outputs never leave EngineCore).
    children: dict[str, Request] = field(default_factory=dict)
    #: Children that ended in this step (their outputs are still filtered).
    ended_children: set[str] = field(default_factory=set)
    #: Each request's phase transitions, and what is counted from them.
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    #: Parents whose children have all ended, to join in this step.
    ready_joins: list[str] = field(default_factory=list)
    #: Outputs (client_index, output) made outside update_from_output,
    #: delivered by the next one.
    pending_outputs: list[tuple[int, EngineCoreOutput]] = field(default_factory=list)
    #: Joined parents whose resume prefill is being counted.
    accounting: dict[str, HookState] = field(default_factory=dict)
    #: Family ledgers by root request id, those with a deadline, and those
    #: to cut at the next step.
    families: dict[str, FamilyLedger] = field(default_factory=dict)
    timed_families: set[FamilyLedger] = field(default_factory=set)
    families_to_cut: list[FamilyLedger] = field(default_factory=list)
    #: Children of forks waiting for the live-children limits, oldest first.
    deferred_children: deque[DeferredChild] = field(default_factory=deque)
    #: Child request id -> clock reading at which it times out.
    child_deadlines: dict[str, float] = field(default_factory=dict)
    #: This step's fair share: vLLM's admission skips the children it
    #: preempted and the over-share children it holds back.
    share_step: StepShare | None = None
    #: Requests other than children added so far, and each live one's
    #: place in that count (fair share preempts a family's children only
    #: for requests that arrived after it forked).
    arrivals: int = 0
    arrival_order: dict[str, int] = field(default_factory=dict)
    #: Requests whose every step needs hook work (quiet_ids None), and the
    #: token ids any quiet request watches: a step with no loud request and
    #: none of these ids sampled needs no hook work at all.
    loud: set[str] = field(default_factory=set)
    watched_ids: frozenset[int] = frozenset()
    #: Requests whose stop needs hook work (``HookState.watch_stop``): a
    #: step may skip the hooks only while none of them runs.
    stop_watch: set[str] = field(default_factory=set)
    last_watched: frozenset[int] | None = None

    @property
    def num_parked(self) -> int:
        return self.lifecycle.num_parked

    def waits_for_children(self, request_id: str) -> bool:
        """Whether ``request_id`` is parked: its join comes when its open
        children have all ended."""
        st = self.states.get(request_id)
        return st is not None and st.parked

    @property
    def idle(self) -> bool:
        """Nothing in flight: a step's outputs need no fork/join handling."""
        return not (self.children or self.lifecycle.parked_this_step or self.pending_outputs
                    or self.ready_joins or self.ended_children or self.tree.nodes)

    @property
    def plain(self) -> bool:
        """Nothing in flight and nothing pending for the next step: no
        parked parent, deferred child, join's prefill being counted, family
        deadline or family to cut, loud request or watched stop (a step is
        vLLM's own unless a request samples a watched token)."""
        return self.idle and not (self.lifecycle.num_parked or self.deferred_children
                                  or self.accounting or self.timed_families
                                  or self.families_to_cut or self.loud or self.stop_watch)

    def set_quiet(self, st: HookState, quiet_ids: frozenset[int] | None) -> None:
        """Set ``st.quiet_ids`` (None: the request is loud)."""
        st.quiet_ids = quiet_ids
        rid = st.request.request_id
        if quiet_ids is None:
            self.loud.add(rid)
            return
        self.loud.discard(rid)
        if quiet_ids is not self.last_watched and not quiet_ids <= self.watched_ids:
            self.watched_ids |= quiet_ids
        self.last_watched = quiet_ids  # (scanners give the same set again and again)

    def refresh_quiet(self, st: HookState) -> None:
        """A request is quiet unless its tokens are charged to a family, a
        join's prefill is being counted, or its family ran out; then it
        watches what its scanner watches (nothing without a scanner). A
        descendant whose charges are deferred is not charged as it samples.
        Its stop is watched while it runs with open children (it parks) or
        its scanner has an event for its end (an open payload); a parked
        request does not run."""
        scanner = st.scanner
        rid = st.request.request_id
        st.watch_stop = scanner is not None and not st.parked and (
            scanner.pending_finish or self.tree.has_open_children(rid))
        if st.watch_stop:
            self.stop_watch.add(rid)
        else:
            self.stop_watch.discard(rid)
        if (st.charged_per_step or st.accounting is not None or st.draining
                or (st.family is not None and st.family.exhausted_by is not None)):
            self.set_quiet(st, None)
        else:
            self.set_quiet(st, frozenset() if scanner is None else scanner.watched_ids())

    def quiet_problems(self) -> list[str]:
        """Where the quiet path's engine-wide indexes (``loud``,
        ``stop_watch``, ``watched_ids``) disagree with the per-request
        fields they index (``quiet_ids``, ``watch_stop``): the fields are
        the source, the indexes are recounted from them (the surgical
        harness checks at every step)."""
        found = []
        loud = {rid for rid, st in self.states.items() if st.quiet_ids is None}
        if loud != self.loud:
            found.append(f"loud {sorted(self.loud)} but quiet_ids None for {sorted(loud)}")
        watching = {rid for rid, st in self.states.items() if st.watch_stop}
        if watching != self.stop_watch:
            found.append(f"stop_watch {sorted(self.stop_watch)} but watch_stop set for "
                         f"{sorted(watching)}")
        for rid, st in self.states.items():
            if st.quiet_ids is not None and not st.quiet_ids <= self.watched_ids:
                found.append(f"{rid} watches ids outside watched_ids: "
                             f"{sorted(st.quiet_ids - self.watched_ids)}")
        return found

    # ----------------------------------------------------------- removal
    def drop_state(self, rid: str) -> HookState | None:
        """Forget a request's hook state (recording its sampled tokens in
        its tree node)."""
        st = self.states.pop(rid, None)
        self.loud.discard(rid)
        self.stop_watch.discard(rid)
        if st is not None:
            self.lifecycle.forget(st)
            node = self.tree.get(rid)
            if node is not None:
                node.sampled_tokens = st.sampled
        return st

    def drop_family(self, rid: str) -> FamilyLedger | None:
        family = self.families.pop(rid, None)
        if family is not None:
            self.timed_families.discard(family)
        return family

    def forget(self, rid: str) -> None:
        """Forget everything about a request (its whole tree if it is a root)."""
        self.drop_state(rid)
        self.children.pop(rid, None)
        self.accounting.pop(rid, None)
        self.child_deadlines.pop(rid, None)
        node = self.tree.get(rid)
        if node is not None and node.parent_id is None:
            self.tree.pop_tree(rid)
        self.drop_family(rid)
        if self.deferred_children:
            self.deferred_children = deque(
                d for d in self.deferred_children if rid not in (d.parent_id, d.child_id))

    def drop_tree(self, rid: str) -> None:
        for node in self.tree.pop_tree(rid):
            self.forget(node.request_id)

    def sizes(self, **extra: Any) -> dict[str, int]:
        """Sizes of the state (for leak checks)."""
        return {
            "nodes": len(self.tree),
            "hook_states": len(self.states),
            "children": len(self.children),
            "accounting": len(self.accounting),
            "pending_outputs": len(self.pending_outputs),
            "parked": self.num_parked,
            "families": len(self.families),
            "child_deadlines": len(self.child_deadlines),
            "deferred_children": len(self.deferred_children),
            "arrival_order": len(self.arrival_order),
            "stop_watch": len(self.stop_watch),
            **extra,
        }
