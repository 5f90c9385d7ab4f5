"""The output side of a step: children's outputs stay in EngineCore, a
parked parent whose children have ended takes their merged outputs and
resumes (or finishes), and a finished request carries its trace."""

from __future__ import annotations

import logging
import time

from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason
from vllm.v1.request import Request, RequestStatus, StreamingUpdate

from vllm_seqhooks.dependencies import (
    FAILED,
    FINISHED,
    MERGED,
    SAMPLED_BEFORE_ARG,
    build_trace,
)
from vllm_seqhooks.join_plan import contribution, first_child_covers, fit_merge, resumes
from vllm_seqhooks.sched.state import HookState

# Under vLLM's "vllm" logger: same handlers, format and VLLM_LOGGING_LEVEL.
logger = logging.getLogger("vllm.seqhooks.scheduler")

#: Key of the hook trace in a finished request's ``kv_transfer_params``.
TRACE_KEY = "seqhooks"


class JoinMixin:
    """Filters children's outputs, joins parked parents, attaches traces."""

    def update_from_output(self, scheduler_output, model_runner_output):
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        if self._requeue_after_step:
            for req in self._requeue_after_step:
                if req.status == RequestStatus.WAITING_FOR_STREAMING_REQ:
                    self.waiting.add_request(req)
                    self.deferred_waiting.add(req)
            self._requeue_after_step = []
        if not (self._children or self._parked_this_step or self._pending_outputs
                or self._ready_joins or self._ended_children or self.deps.nodes):
            return outputs
        parked_now = self._parked_this_step
        self._parked_this_step = set()
        for client_index, eco in list(outputs.items()):
            kept: list[EngineCoreOutput] = []
            for out in eco.outputs:
                rid = out.request_id
                child = self._children.get(rid)
                if child is not None or rid in self._ended_children:
                    # Children's outputs never leave EngineCore.
                    if (child is not None and out.finish_reason is not None
                            and rid not in parked_now):
                        state = FINISHED if out.finish_reason in (
                            FinishReason.STOP, FinishReason.LENGTH,
                            FinishReason.REPETITION) else FAILED
                        self._child_ended(child, state, out.finish_reason)
                    continue
                if rid in parked_now:
                    out.finish_reason = None
                    out.stop_reason = None
                    st = self._hook_states.get(rid)
                    if st is not None and st.stop_pos is not None and out.new_token_ids:
                        # Hold the stop token back: the frontend drops the
                        # last token of a stop-terminated output from the
                        # text, so it must come after the merged tokens.
                        out.new_token_ids = list(out.new_token_ids[:-1])
                elif out.finish_reason is not None and rid in self.deps:
                    self._attach_trace(out)
                kept.append(out)
            eco.outputs = kept
            if eco.finished_requests:
                eco.finished_requests = {
                    r for r in eco.finished_requests
                    if r not in self._children and r not in self._ended_children
                }
        # Joins (may cascade: a child finishing after its own join).
        while self._ready_joins:
            rid = self._ready_joins.pop(0)
            self._join(rid)
        for client_index, out in self._pending_outputs:
            eco = outputs.get(client_index)
            if eco is None:
                eco = outputs[client_index] = EngineCoreOutputs()
            merged = False
            for existing in eco.outputs:
                if existing.request_id == out.request_id and existing.finish_reason is None:
                    existing.new_token_ids = list(existing.new_token_ids) + list(out.new_token_ids)
                    existing.finish_reason = out.finish_reason
                    existing.stop_reason = out.stop_reason
                    existing.kv_transfer_params = out.kv_transfer_params
                    merged = True
                    break
            if not merged:
                eco.outputs.append(out)
        self._pending_outputs = []
        self._ended_children.clear()
        self._publish_metrics()
        return outputs

    def _child_ended(self, child: Request, state: str, finish_reason) -> None:
        rid = child.request_id
        if rid not in self._children:
            return
        st = self._hook_states.get(rid)
        tokens = self._contribution(st) if state == FINISHED and st is not None else []
        reason = str(finish_reason) if finish_reason is not None else state
        self._close_child(rid, st, state, tokens, reason)

    def _close_child(self, rid: str, st: HookState | None, state: str, tokens: list[int],
                     reason: str) -> None:
        """A child ended: its state goes, its parent gets ``tokens`` and joins
        once its other open children have ended too."""
        del self._children[rid]
        self._ended_children.add(rid)
        self._drop_state(rid, None)  # records its sampled tokens in its node
        self._accounting.pop(rid, None)
        self._family_child_ended(st, rid)
        self.metrics.child_ended(state)
        parent_id = self.deps.child_ended(rid, state, tokens, reason)
        if parent_id is not None:
            self._ready_joins.append(parent_id)

    def _contribution(self, st: HookState, merged: list[int] = ()) -> list[int]:
        """What a finished request gives its parent (join_plan.contribution):
        what it generated after its prompt without the EOS / stop token that
        ended it, the merge it finished with, and a tag format's end text for
        a child that did not end at its end tag."""
        req = st.request
        stop_pos = st.stop_pos
        if stop_pos is None and req.status == RequestStatus.FINISHED_STOPPED and (
            isinstance(req.stop_reason, int) or req.stop_reason is None
        ):
            stop_pos = req.num_tokens - 1
        fmt = self.hooks.tag_format
        closing = ()
        if fmt is not None and fmt.child_end_tag and not st.ended_by_tag:
            closing = self._text_codec().encode(fmt.eos_text)
        return contribution(req.all_token_ids, st.orig_prompt_len, stop_pos, merged, closing)

    def _join(self, rid: str) -> None:
        st = self._hook_states.get(rid)
        if st is None or not st.parked:
            return
        req = st.request
        hooks = self.hooks
        node = self.deps.get(rid)
        if node is not None and node.blocked_since is not None:
            self.metrics.observe_park(time.time() - node.blocked_since)
        suffix = self._text_codec().encode(hooks.merge_suffix) if hooks.merge_suffix else ()
        merged, child_ids = self.deps.take_merge(
            rid, st.separator, hooks.failed_child_marker_token_ids, suffix,
        )
        if hooks.merge_strategy == "none":
            merged = []
        node = self.deps.get(rid)
        record = node.joins[-1]
        self._unpark(st)
        self.metrics.inc("joins", 1)
        # Room left under max_model_len (rule 7).
        room = self.max_model_len - req.num_tokens
        merged, record.truncated = fit_merge(merged, room)
        self.metrics.inc("truncated_merges", int(record.truncated))
        record.merged_tokens = len(merged)
        self.metrics.inc("merged_tokens", len(merged))
        remaining = st.orig_max_tokens - st.sampled
        finish_status = st.final_status
        if finish_status is None and not resumes(
                truncated=record.truncated, merged=len(merged), room=room,
                remaining=remaining, family_stops=self._stops_family_member(st)):
            finish_status = RequestStatus.FINISHED_LENGTH_CAPPED
        if finish_status is not None:
            self._finish_after_join(st, merged, finish_status)
            return
        # Resume: [<sync>] + merged become prompt tokens; only they prefill.
        if self._first_child_covers_merge(st, child_ids):
            self._release_blocks(st)  # resume through the prefix cache
        if st.spilled_frontier is not None:
            req.num_computed_tokens = st.spilled_frontier
        sp = req.sampling_params.clone()
        sp.max_tokens = remaining
        sp.min_tokens = max(0, st.orig_min_tokens - st.sampled)
        extra = dict(sp.extra_args or {})
        extra[SAMPLED_BEFORE_ARG] = st.sampled
        sp.extra_args = extra
        sync_token = req.all_token_ids[-1]
        # Never extend the caller's own prompt list in place.
        req.prompt_token_ids = list(req.prompt_token_ids)
        update = StreamingUpdate(
            mm_features=None,
            prompt_token_ids=[sync_token, *merged],
            max_tokens=remaining,
            arrival_time=req.arrival_time,
            sampling_params=sp,
        )
        self._update_request_as_session(req, update)
        if st.spilled_frontier is not None:
            # Re-admit through the prefix cache: recompute what was evicted.
            req.num_computed_tokens = 0
            st.spilled_frontier = None
        req.stop_reason = None
        st.accounting = record
        self._accounting[rid] = st
        if merged and rid not in self._children:
            self._pending_outputs.append(
                (req.client_index, EngineCoreOutput(request_id=rid, new_token_ids=list(merged)))
            )
        logger.debug("%s joined %d children: %d merged tokens", rid,
                     len(record.children), len(merged))

    def _first_child_covers_merge(self, st: HookState, children: list[str]) -> bool:
        """A tag format's merge starts with the first child's own sequence
        (the parent's context, the child's start, its output): when the KV
        blocks that child filled go past what the parent computed, the parent
        resumes through the prefix cache and reuses them."""
        if self.hooks.tag_format is None or not children or st.spilled_frontier is not None:
            return False
        node = self.deps.get(children[0])
        return (node is not None and node.state == MERGED and bool(node.sampled_tokens)
                and first_child_covers(node.prompt_tokens + node.sampled_tokens,
                                       st.request.num_computed_tokens, self.block_size))

    def _finish_after_join(
        self, st: HookState, merged: list[int], status: RequestStatus
    ) -> None:
        req = st.request
        rid = req.request_id
        is_child = rid in self._children
        tokens = self._contribution(st, merged) if is_child else None
        stop_reason = st.final_stop_reason
        self._unpark(st)
        if st.spilled_frontier is not None:
            req.num_computed_tokens = st.spilled_frontier
            st.spilled_frontier = None
        super().finish_requests([rid], status)
        if is_child:
            self._close_child(rid, st, FINISHED, tokens,
                              str(RequestStatus.get_finished_reason(status)))
            return
        held = [req.all_token_ids[st.stop_pos]] if st.stop_pos is not None else []
        out = EngineCoreOutput(
            request_id=rid,
            new_token_ids=[*merged, *held],
            finish_reason=RequestStatus.get_finished_reason(status),
            stop_reason=stop_reason,
        )
        self._attach_trace(out)
        self._drop_state(rid, None)
        self._pending_outputs.append((req.client_index, out))

    def _attach_trace(self, out: EngineCoreOutput) -> None:
        rid = out.request_id
        node = self.deps.get(rid)
        if node is None or node.parent_id is not None:
            return
        nodes = self.deps.pop_tree(rid)
        family = self._drop_family(rid)
        trace = build_trace(nodes, limits=family.summary() if family is not None else None)
        params = dict(out.kv_transfer_params or {})
        params[TRACE_KEY] = trace
        out.kv_transfer_params = params
        self._drop_state(rid, None)
        for n in nodes[1:]:
            self._children.pop(n.request_id, None)
            self._drop_state(n.request_id, None)
