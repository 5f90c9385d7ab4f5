"""What a request just sampled: the family's limits trim it, the scanner
finds closed payloads (children spawn) and ``<sync>`` (the request parks),
and a request that finishes with open children parks instead."""

from __future__ import annotations

from vllm.v1.request import Request, RequestStatus

from vllm_seqhooks.formats import EndTagReached, ForkReached
from vllm_seqhooks.sched.speculative import count_as_rejected
from vllm_seqhooks.sched.state import HookState
from vllm_seqhooks.tokens import PayloadClosed, PromiseIgnored, SyncReached


class SamplingMixin:
    """Sampled tokens in, spawns and parking out."""

    def _update_request_with_output(
        self, request: Request, new_token_ids: list[int], is_stale: bool = False
    ) -> tuple[list[int], bool]:
        st = self._hook_states.get(request.request_id)
        if st is not None and st.scanner is not None and len(new_token_ids) > 1:
            self._trim_after_sync(st, new_token_ids, is_stale)
        start = request.num_tokens
        offered = len(new_token_ids)
        was_preempted = request.status == RequestStatus.PREEMPTED
        cut = False
        if st is not None and st.family is not None:
            allowed = self._tokens_allowed(st, offered)
            if allowed < offered:
                del new_token_ids[allowed:]
                cut = True
        new_token_ids, stopped = super()._update_request_with_output(
            request, new_token_ids, is_stale
        )
        if st is not None and st.family is not None:
            self._charge(st, len(new_token_ids))
            if not stopped and (cut or self._stops_family_member(st)):
                # The family's budget or deadline ends this request here.
                request.status = RequestStatus.FINISHED_LENGTH_CAPPED
                stopped = True
        if st is None or not new_token_ids:
            if stopped and st is not None and st.scanner is not None and (
                    self.deps.has_open_children(request.request_id)):
                if offered and not is_stale:
                    count_as_rejected(request, offered)
                self._park(st, stopped_by_finish=True)
            return new_token_ids, stopped
        if stopped and len(new_token_ids) < offered and not is_stale:
            # vLLM stopped at a token before the last (speculative decoding).
            # A finished request never computes again, but one that parks
            # for its children resumes from its frontier: count the tokens
            # vLLM cut as rejected drafts, as _trim_after_sync does.
            count_as_rejected(request, offered - len(new_token_ids))
        st.preempted_at_stop = was_preempted
        st.sampled += len(new_token_ids)
        if st.accounting is not None:
            self._accounting.pop(request.request_id, None)
            st.accounting = None
        scanner = st.scanner
        if scanner is None:  # it cannot spawn: no open children either
            return new_token_ids, stopped
        for ev in scanner.feed(new_token_ids, start):
            if isinstance(ev, PayloadClosed):
                self._spawn(st, ev)
            elif isinstance(ev, PromiseIgnored):
                self._ignore_promise(st, ev.pos, ev.reason)
            elif isinstance(ev, ForkReached):
                self._fork(st, ev)
            elif isinstance(ev, EndTagReached) and not stopped:
                # A child's end tag (_trim_after_sync made it the step's last
                # token): it finishes here, the tag kept in its output.
                request.status = RequestStatus.FINISHED_STOPPED
                request.stop_reason = self.hooks.child_end_tag
                st.ended_by_tag = stopped = True
                break
            if isinstance(ev, (SyncReached, ForkReached)) and self.deps.has_open_children(
                request.request_id
            ):
                # _trim_after_sync made this <sync> or fork tag the step's
                # last token; a fork joins when its children end.
                self._park(st, stopped_by_finish=stopped)
                return new_token_ids, True
        if stopped:
            end = request.num_tokens
            if request.status == RequestStatus.FINISHED_STOPPED:
                end -= 1  # the EOS / stop token is not part of a payload
            for ev in scanner.finish(end):
                self._spawn(st, ev)
            if self.deps.has_open_children(request.request_id):
                self._park(st, stopped_by_finish=True)
        return new_token_ids, stopped


    def _park(self, st: HookState, *, stopped_by_finish: bool) -> None:
        request = st.request
        if stopped_by_finish:
            st.final_status = request.status
            st.final_stop_reason = request.stop_reason
            if request.status == RequestStatus.FINISHED_STOPPED:
                st.stop_pos = request.num_tokens - 1
        else:
            request.status = RequestStatus.FINISHED_STOPPED
        request.stop_reason = None
        if st.preempted_at_stop:
            # vLLM preempted the request while this step was in flight: its
            # blocks are gone (num_computed_tokens == 0) and vLLM takes it out
            # of every queue after this step. Park it as spilled: it resumes
            # through the prefix cache, and is queued again after the step.
            st.spilled_frontier = request.num_tokens - (0 if stopped_by_finish else 1)
            self._requeue_after_step.append(request)
        st.parked = True
        self._num_parked += 1
        # The worker drops its state for the parked request (freeing its
        # model-runner slot); it is re-sent in full when the request resumes.
        self.finished_req_ids.add(request.request_id)
        self.deps.block(request.request_id)
        self._park_pending.add(request.request_id)
        self._parked_this_step.add(request.request_id)
        if self.deps.ready_to_join(request.request_id):
            self._ready_joins.append(request.request_id)

    def _unpark(self, st: HookState) -> None:
        if st.parked:
            st.parked = False
            self._num_parked -= 1

    def _handle_stopped_request(self, request: Request) -> bool:
        if request.request_id not in self._park_pending:
            return super()._handle_stopped_request(request)
        self._park_pending.discard(request.request_id)
        was_resumable, request.resumable = request.resumable, True
        try:
            finished = super()._handle_stopped_request(request)
        finally:
            request.resumable = was_resumable
        assert not finished
        return False
