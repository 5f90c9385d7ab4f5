"""What a request sampled in a step, with hook work: cut (a tag that stops
it, its family's budget), appended by vLLM, charged, scanned, and what the
events mean applied (spawn, park, end at a tag). The scheduler's
``_update_request_with_output`` sends here only the steps that need it: a
loud request's, a step with a watched token, and the stop of a request
whose stop is watched (``HookState.watch_stop``)."""

from __future__ import annotations

from typing import Callable

from vllm.v1.request import RequestStatus

from vllm_seqhooks.config.special_kwargs import SpecialKwargs
from vllm_seqhooks.engine.family_limits import FamilyLimits
from vllm_seqhooks.engine.parking import Parking
from vllm_seqhooks.engine.spawning import Spawning
from vllm_seqhooks.engine.speculative import Speculative
from vllm_seqhooks.engine.splicing import Splicing
from vllm_seqhooks.engine.state import ForkJoinState, HookState
from vllm_seqhooks.engine.vllm_private import count_as_rejected
from vllm_seqhooks.formats.events import (
    EndTagReached,
    ForkReached,
    PayloadClosed,
    PromiseIgnored,
    SyncReached,
)


class Sampling:
    """The hook path of a step's sampled tokens. ``vllm_update(request,
    new_token_ids, is_stale)``: vLLM's own ``_update_request_with_output``
    (it appends the tokens and checks vLLM's stops), through
    ``vllm_private.request_update_for_hooks`` (what it cuts after a stop is
    not counted computed, on every release)."""

    def __init__(self, fork_join: ForkJoinState, hooks: SpecialKwargs,
                 vllm_update: Callable[..., tuple[list[int], bool]],
                 family_limits: FamilyLimits, speculative: Speculative, spawning: Spawning,
                 parking: Parking, splicing: Splicing) -> None:
        self.fork_join = fork_join
        self.hooks = hooks
        self.vllm_update = vllm_update
        self.family_limits = family_limits
        self.speculative = speculative
        self.spawning = spawning
        self.parking = parking
        self.splicing = splicing

    def update_watching_stop(self, st: HookState, new_token_ids: list[int],
                             is_stale: bool) -> tuple[list[int], bool]:
        """A quiet step of a request whose stop parks it or closes its
        payload: vLLM's own work, then, if it stopped, the hooks'."""
        request = st.request
        start = request.num_tokens
        was_preempted = request.status == RequestStatus.PREEMPTED
        kept, stopped = self.vllm_update(request, new_token_ids, is_stale)
        if not stopped:
            return kept, stopped
        kept, stopped = self.after_append(st, kept, stopped, start, 0, was_preempted,
                                          False, is_stale)
        self.fork_join.refresh_quiet(st)
        return kept, stopped

    def update_watched(self, st: HookState, new_token_ids: list[int],
                       is_stale: bool) -> tuple[list[int], bool]:
        """A step with hook work: cut, append (vLLM), charge, scan, apply."""
        request = st.request
        if st.draining:  # its end tag's KV is computed now: it ends there
            self.fork_join.lifecycle.drained(st)
            self.end_at_tag(st)
            self.finish_or_park(st)
            return [], True
        # 1. Cut what the request may not keep: tokens after a tag that
        #    stops it (speculative decoding), tokens past its family's budget.
        if st.scanner is not None and len(new_token_ids) > 1:
            self.speculative.cut_after_parking_tag(st, new_token_ids, is_stale)
        offered = len(new_token_ids)
        over_budget = self.family_limits.trim_to_budget(st, new_token_ids)
        trimmed = offered - len(new_token_ids)
        start = request.num_tokens
        was_preempted = request.status == RequestStatus.PREEMPTED
        # 2. vLLM appends them and checks its own stops (what it cut after a
        #    stop is not counted computed: vllm_private.request_update_for_hooks).
        new_token_ids, stopped = self.vllm_update(request, new_token_ids, is_stale)
        return self.after_append(st, new_token_ids, stopped, start, trimmed, was_preempted,
                                 over_budget, is_stale)

    def after_append(self, st: HookState, new_token_ids: list[int], stopped: bool,
                     start: int, trimmed: int, was_preempted: bool, over_budget: bool,
                     is_stale: bool) -> tuple[list[int], bool]:
        """After vLLM appended what a request kept (the first at ``start``;
        ``trimmed``: the tokens its family's budget cut before): charge,
        scan, apply."""
        request = st.request
        self.family_limits.charge(st, len(new_token_ids))
        if not stopped and (over_budget or self.family_limits.stops_member(st)):
            request.status = RequestStatus.FINISHED_LENGTH_CAPPED  # its family stopped
            stopped = True
        if not new_token_ids:
            # Nothing kept (its family's budget): it may stop with open children.
            if stopped and st.scanner is not None and self.fork_join.tree.has_open_children(
                    request.request_id):
                if trimmed and not is_stale:
                    count_as_rejected(request, trimmed)
                self.parking.park(st, stopped_by_finish=True)
            return new_token_ids, stopped
        if stopped and trimmed and not is_stale:
            # Its family's budget cut tokens it sampled (speculative
            # decoding). A finished request never computes again, but one
            # that parks for its children resumes from its frontier: count
            # them as rejected drafts.
            count_as_rejected(request, trimmed)
        st.preempted_at_stop = was_preempted
        if st.accounting is not None:
            self.fork_join.accounting.pop(request.request_id, None)
            st.accounting = None
        if st.scanner is None:  # it cannot spawn: no open children either
            return new_token_ids, stopped
        # 3. Scan them and apply what they mean.
        events = st.scan(new_token_ids, start)
        parked = False
        if events:
            parked, stopped = self.apply_events(st, events, stopped)
        if parked:
            return new_token_ids, True
        if stopped:
            self.finish_or_park(st)
        return new_token_ids, stopped

    def end_at_tag(self, st: HookState) -> None:
        """A tag format's child finishes at its end tag, kept in its output."""
        st.request.status = RequestStatus.FINISHED_STOPPED
        st.request.stop_reason = self.hooks.child_end_tag
        st.ended_by_tag = True

    def apply_events(self, st: HookState, events: list, stopped: bool) -> tuple[bool, bool]:
        """Apply the scanner's ``events`` of a step: spawn children, park at
        a ``<sync>`` or fork tag, end a child at its end tag.
        Returns (parked, stopped)."""
        request = st.request
        tree = self.fork_join.tree
        for ev in events:
            if isinstance(ev, PayloadClosed):
                self.spawning.spawn(st, ev)
            elif isinstance(ev, PromiseIgnored):
                self.spawning.ignore_promise(st, ev.pos, ev.reason)
            elif isinstance(ev, ForkReached):
                self.spawning.fork(st, ev)
            elif isinstance(ev, EndTagReached) and not stopped and self.splicing.drains(
                    request.request_id):
                self.fork_join.lifecycle.drain(st)  # one more step computes the tag's KV
                self.fork_join.set_quiet(st, None)
                return False, False
            elif isinstance(ev, EndTagReached) and not stopped:
                # A child's end tag (the step's last token, see speculative):
                # it finishes here, the tag kept in its output.
                self.end_at_tag(st)
                return False, True
            if (isinstance(ev, (SyncReached, ForkReached))
                    and tree.has_open_children(request.request_id)):
                # The step's last token (see speculative); a fork joins when
                # its children end.
                if isinstance(ev, ForkReached):
                    st.fork = ev
                self.parking.park(st, stopped_by_finish=stopped)
                return True, True
        return False, stopped

    def finish_or_park(self, st: HookState) -> None:
        """The request stopped: a payload still open spawns, and a request
        with open children parks until they end."""
        request = st.request
        end = request.num_tokens
        if request.status == RequestStatus.FINISHED_STOPPED:
            end -= 1  # the EOS / stop token is not part of a payload
        for ev in st.scanner.finish(end):
            self.spawning.spawn(st, ev)
        if self.fork_join.tree.has_open_children(request.request_id):
            self.parking.park(st, stopped_by_finish=True)
