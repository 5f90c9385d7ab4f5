"""Joins: a child that ended gives its parent its output, and a parked
parent whose children have all ended takes their merged outputs and
resumes or finishes (:mod:`vllm_seqhooks.core.join_plan` decides)."""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass
from typing import Callable

from vllm.v1.engine import EngineCoreOutput
from vllm.v1.request import Request, RequestStatus, StreamingUpdate

from vllm_seqhooks.config.request_keys import POSITION_SHIFT_ARG, SAMPLED_BEFORE_ARG
from vllm_seqhooks.config.special_kwargs import SpecialKwargs
from vllm_seqhooks.core.join_plan import (
    Piece, common_prefix, contribution, cut_pieces, first_child_covers, fit_merge,
    layout_pieces, resumes)
from vllm_seqhooks.core.request_tree import FINISHED, MERGED, JoinRecord
from vllm_seqhooks.engine.family_limits import FamilyLimits
from vllm_seqhooks.engine.family_trace import attach_trace
from vllm_seqhooks.engine.logprob_rows import LogprobRows, as_lists, forced_row
from vllm_seqhooks.engine.metrics import HookMetrics
from vllm_seqhooks.engine.parking import Parking
from vllm_seqhooks.engine.splicing import Splicing
from vllm_seqhooks.engine.state import ForkJoinState, HookState
from vllm_seqhooks.engine.vllm_private import SchedulerPort
from vllm_seqhooks.formats.boundaries import ChildText, child_output, join_tokens

# Under vLLM's "vllm" logger: same handlers, format and VLLM_LOGGING_LEVEL.
logger = logging.getLogger("vllm.seqhooks.scheduler")


class Joins:
    """Ends children, joins parked parents (they resume or finish with the
    merge). ``text_codec()``: the engine's text codec."""

    def __init__(self, fork_join: ForkJoinState, hooks: SpecialKwargs, metrics: HookMetrics,
                 vllm: SchedulerPort, family_limits: FamilyLimits, parking: Parking,
                 splicing: Splicing, logprob_rows: LogprobRows, text_codec: Callable) -> None:
        self.fork_join = fork_join
        self.hooks = hooks
        self.metrics = metrics
        self.vllm = vllm
        self.family_limits = family_limits
        self.parking = parking
        self.splicing = splicing
        self.logprob_rows = logprob_rows
        self.text_codec = text_codec

    # ------------------------------------------------------------ children
    def child_ended(self, child: Request, state: str, finish_reason) -> None:
        rid = child.request_id
        fj = self.fork_join
        if rid not in fj.children:
            return
        st = fj.states.get(rid)
        tokens, text = ([], None)
        if state == FINISHED and st is not None:
            tokens, text = self.contribution(st)
            # What it wrote that its parent does not get (its EOS, text
            # after its end tag), and what the engine added (the format's
            # end text): the rollout rows tell sampled from inserted by them.
            written = child.all_token_ids[st.orig_prompt_len:]
            shared = common_prefix(tokens, written)
            node = fj.tree.get(rid)
            node.appended_tokens = len(tokens) - shared
            node.dropped_token_ids = list(written[shared:])
        reason = str(finish_reason) if finish_reason is not None else state
        self._close_child(rid, st, state, tokens, reason, text)

    def _close_child(self, rid: str, st: HookState | None, state: str, tokens: list[int],
                     reason: str, text: bytes | None = None) -> None:
        """A child ended: its state goes, its parent gets ``tokens`` and joins
        once its other open children have ended too."""
        fj = self.fork_join
        del fj.children[rid]
        fj.ended_children.add(rid)
        fj.drop_state(rid)  # records its sampled tokens in its node
        fj.accounting.pop(rid, None)
        fmt = self.hooks.tag_format
        if (state == FINISHED and st is not None and not st.ended_by_tag and fmt is not None
                and fmt.child_end_tag and fmt.unclosed_child_stop_text is not None):
            parent = fj.states.get(fj.tree.get(rid).parent_id or "")
            if parent is not None:
                parent.unclosed_child = True
        self.family_limits.child_ended(st, rid)
        self.metrics.child_ended(state)
        parent_id = fj.tree.child_ended(rid, state, tokens, reason, text)
        if parent_id is not None and fj.waits_for_children(parent_id):
            fj.ready_joins.append(parent_id)

    def contribution(self, st: HookState, merged: list[int] = (),
                     keep: int | None = None) -> tuple[list[int], bytes | None]:
        """What a finished request gives its parent (join_plan.contribution):
        what it generated after its prompt (its first ``keep`` tokens, when
        it finished at a join that replaced its fork tag's last token)
        without the EOS / stop token that ended it, the merge it finished
        with, and a tag format's end text for a child that did not end at its
        end tag; and, for a ``"text"`` merge, that as text, cut at the end tag
        (formats.boundaries.child_output)."""
        req = st.request
        stop_pos = st.stop_pos
        if stop_pos is None and req.status == RequestStatus.FINISHED_STOPPED and (
            isinstance(req.stop_reason, int) or req.stop_reason is None
        ):
            stop_pos = req.num_tokens - 1
        tokens = req.all_token_ids if keep is None else req.all_token_ids[:keep]
        own = contribution(tokens, st.orig_prompt_len, stop_pos, merged)
        fmt = self.hooks.tag_format
        if fmt is None:
            return own, None
        return child_output(self.text_codec(), fmt, own,
                            ended_by_tag=st.ended_by_tag)

    # --------------------------------------------------------------- joins
    def join_ready(self) -> None:
        """Join every parent whose children have all ended (may cascade: a
        child finishing after its own join); a splice join whose blocks are
        not free yet waits for a later step (``Splicing.waits_for_blocks``)."""
        fj = self.fork_join
        later = []
        while fj.ready_joins:
            rid = fj.ready_joins.pop(0)
            if self.splicing.waits_for_blocks(rid):
                later.append(rid)
            else:
                self._join(rid)
        fj.ready_joins = later

    def _join(self, rid: str) -> None:
        st = self.fork_join.states.get(rid)
        if st is None or not st.parked:
            return
        merge = self._take_merge(st)
        remaining = st.orig_max_tokens - st.sampled
        finish_status = st.final_status
        if finish_status is None and (merge.ends_parent or not resumes(
                truncated=merge.record.truncated, merged=len(merge.tokens), room=merge.room,
                remaining=remaining, family_stops=self.family_limits.stops_member(st))):
            finish_status = RequestStatus.FINISHED_LENGTH_CAPPED
        if merge.tokens and not self.vllm.grammar_accepts(st.request, merge.tokens):
            logger.warning(
                "%s: its structured-output grammar rejects the %d tokens merged from its "
                "children; it finishes with an error (finish_reason 'error')", rid,
                len(merge.tokens))
            finish_status = RequestStatus.FINISHED_ERROR
        if finish_status is not None:
            self._finish_after_join(st, merge, finish_status)
        else:
            self._resume(st, merge, remaining)

    def _take_merge(self, st: HookState) -> "_Merge":
        """Join ``st``'s ended children (see :class:`_Merge`), the merge cut
        to what ``max_model_len`` leaves."""
        fj = self.fork_join
        rid = st.request.request_id
        node = fj.tree.get(rid)
        if st.parked_since is not None:
            self.metrics.observe_park(time.time() - st.parked_since)
        fork, st.fork = st.fork, None
        stop_text = self.hooks.unclosed_child_stop_text if st.unclosed_child else None
        st.unclosed_child = False
        keep, merged, children, pieces = self._merged_tokens(st, node, fork, stop_text)
        record = node.joins[-1]
        frontier = fj.lifecycle.resume(st)
        if pieces is not None and sum(n for _, n in pieces) != len(merged):
            logger.warning("%s: the merge's pieces do not add up; no provenance", rid)
            pieces = None
        room = self.vllm.max_model_len - keep
        merged, record.truncated = fit_merge(merged, room)
        # A fork tag's last token given back unchanged is not a merged one.
        kept = common_prefix(merged, st.request.all_token_ids[keep:])
        record.merged_tokens = len(merged) - kept
        record.at = keep + kept - st.orig_prompt_len
        if pieces is not None:
            record.pieces = [[None if owner is None else fj.tree.get(owner).key, n]
                             for owner, n in cut_pieces(pieces, kept, len(merged))]
        self.metrics.inc("joins", 1)
        self.metrics.inc("truncated_merges", int(record.truncated))
        self.metrics.inc("merged_tokens", record.merged_tokens)
        return _Merge(keep, merged, children, record, room, stop_text is not None, frontier)

    def _merged_tokens(self, st: HookState, node, fork, stop_text: str | None
                       ) -> tuple[int, list[int], list[str], list[Piece] | None]:
        """How many of its tokens the parent keeps (all, or all but a fork
        tag's last token), the tokens that follow them, its joined
        children, and who gave which of those tokens (None where a merge
        re-tokenizes text). A fork's merge ends with ``stop_text`` when
        given, else with the merge suffix (formats.boundaries.join_tokens)."""
        if fork is None:
            return self._promise_merge(st, node)
        return self._fork_merge(st, node, fork, stop_text)

    def _promise_merge(self, st: HookState, node
                       ) -> tuple[int, list[int], list[str], list[Piece]]:
        """The promise protocol's merge: the parent keeps all its tokens;
        its children's outputs follow (core.request_tree.take_merge)."""
        hooks = self.hooks
        tree = self.fork_join.tree
        tokens = st.request.all_token_ids
        suffix = (self.text_codec().encode(hooks.merge_suffix)
                  if hooks.merge_suffix else ())
        merged, children = tree.take_merge(
            node.request_id, st.separator, hooks.failed_child_marker_token_ids, suffix)
        if hooks.merge_strategy == "none":
            return len(tokens), [], children, []
        marker = len(hooks.failed_child_marker_token_ids or ())
        took = [tree.get(c).state == MERGED for c in children]
        pieces = layout_pieces(
            0, [0] * len(children),
            [len(tree.get(c).output_tokens or ()) if ok else marker
             for c, ok in zip(children, took)],
            [c if ok else None for c, ok in zip(children, took)],
            len(st.separator), len(suffix))
        return len(tokens), merged, children, pieces

    def _fork_merge(self, st: HookState, node, fork, stop_text: str | None
                    ) -> tuple[int, list[int], list[str], list[Piece] | None]:
        """A tag format's merge after its fork tag: spliced, or the
        children's headers and outputs joined as the format writes them."""
        hooks = self.hooks
        tree = self.fork_join.tree
        merges = hooks.merge_strategy != "none"
        tokens = st.request.all_token_ids
        pieces = []
        for cid in node.open_children:
            child = tree.get(cid)
            done = child.state == FINISHED
            pieces.append(ChildText(child.label or "", child.output_tokens if done else None,
                                    child.output_text if done else None))
        children = tree.join_open_children(node.request_id)
        codec = self.text_codec()
        context = tokens[: fork.pos + 1]
        suffix_text = hooks.merge_suffix if stop_text is None else stop_text
        if not merges:  # the parent only waited
            pieces, suffix_text = [], ""
        splicing = self.splicing
        if splicing.enabled and pieces:
            record = node.joins[-1]
            if all(p.tokens is not None for p in pieces):
                merged, record.fallback = splicing.merge(
                    st, fork.pos, children, codec.encode(suffix_text), record)
                if merged is not None:
                    record.mode = "splice"
                    pieces = self._splice_pieces(children, len(merged))
                    record.splice_paths = [n_start + n_out for (_, n_start), (_, n_out)
                                           in zip(pieces[1:-1:2], pieces[2:-1:2])]
                    return fork.pos, merged, children, pieces
            else:
                splicing.give_back(children)
                record.fallback = "a child failed"
        merged = join_tokens(codec, hooks.tag_format, context, fork.tag_start, pieces,
                             st.separator, suffix_text, hooks.failed_child_marker_token_ids or ())
        if hooks.tag_format.boundary_tokenization != "ids":
            return fork.pos, merged, children, None  # boundaries re-tokenized as text
        fmt = hooks.tag_format
        marker = len(hooks.failed_child_marker_token_ids or ())
        layout = layout_pieces(
            len(codec.encode(fmt.child_start(pieces[0].label))) if pieces else 0,
            [len(codec.encode(fmt.header(p.label))) for p in pieces],
            [len(p.tokens) if p.tokens is not None else marker for p in pieces],
            [c if p.tokens is not None else None for c, p in zip(children, pieces)],
            len(st.separator), len(codec.encode(suffix_text)))
        lead = len(merged) - sum(n for _, n in layout)  # the fork tag's end, as given back
        return fork.pos, merged, children, [(None, lead), *layout] if lead >= 0 else None

    def _merge_rows(self, st: HookState, keep: int, merged: list[int],
                    record: JoinRecord) -> list | None:
        """The logprob rows of a join's ``merged`` tokens, when the request
        asked for them (:meth:`LogprobRows.join_rows`)."""
        params = st.request.sampling_params
        if params is None or params.logprobs is None:
            return None
        return self.logprob_rows.join_rows(
            st.request.request_id, keep - st.orig_prompt_len, merged, record,
            self.fork_join)

    def _splice_pieces(self, children: list[str], total: int) -> list[Piece]:
        """A splice merge: the fork tag's last token, each path (its child's
        start, then its output), the suffix."""
        tree = self.fork_join.tree
        pieces: list[Piece] = [(None, 1)]
        for cid in children:
            node = tree.get(cid)
            pieces += [(None, len(node.start_tokens)), (cid, len(node.output_tokens or ()))]
        return [*pieces, (None, total - sum(n for _, n in pieces))]

    def _resume(self, st: HookState, merge: "_Merge", remaining: int) -> None:
        """The parent samples again on its first ``keep`` tokens and the
        merged ones: what it had not computed of them (its ``<sync>`` or fork
        tag's last token) and the merged tokens become prompt tokens (vLLM's
        streaming-session update), so only they prefill. A parent whose KV
        was spilled (``merge.frontier``) resumes through the prefix cache."""
        fj = self.fork_join
        req = st.request
        rid = req.request_id
        keep, merged, record, frontier = merge.keep, merge.tokens, merge.record, merge.frontier
        spliced = self.splicing.computed_after(rid)
        if spliced is None and frontier is None and (
                req.num_computed_tokens > keep
                or self._first_child_covers_merge(st, keep, merged, merge.children)):
            # Resume through the prefix cache: on the first child's KV
            # blocks, or because KV was computed past the tokens it keeps
            # (a block holding the replaced token may be cached already).
            frontier = self.parking.give_back_blocks(req)
        if frontier is not None:
            req.num_computed_tokens = min(frontier, keep)
        uncomputed = req.all_token_ids[req.num_computed_tokens:keep]
        # Never extend the caller's own prompt list in place.
        req.prompt_token_ids = list(req.prompt_token_ids)
        update = StreamingUpdate(
            mm_features=None,
            prompt_token_ids=[*uncomputed, *merged],
            max_tokens=remaining,
            arrival_time=req.arrival_time,
            sampling_params=_resumed_params(st, remaining, self.splicing.final_shift(rid)),
        )
        sampled = st.sampled
        self.vllm.resume_session(req, update)  # (a new segment)
        if spliced is not None:  # the fork tag and the paths: copied KV
            req.num_computed_tokens = spliced
            self.splicing.resumed(req)
        st.sampled_before = sampled
        if frontier is not None:
            # Re-admit through the prefix cache: recompute what was evicted.
            req.num_computed_tokens = 0
        self.parking.unpark_to_queue(req)  # (its computed tokens say which queue)
        req.stop_reason = None
        st.accounting = record
        fj.set_quiet(st, None)
        fj.accounting[rid] = st
        rows = self._merge_rows(st, keep, merged, record)
        if merged and rid not in fj.children:
            fj.pending_outputs.append((req.client_index, EngineCoreOutput(
                request_id=rid, new_token_ids=list(merged),
                new_logprobs=as_lists(rows) if rows else None)))
        logger.debug("%s joined %d children: %d merged tokens", rid,
                     len(record.children), len(merged))

    def _first_child_covers_merge(self, st: HookState, keep: int, merged: list[int],
                                  children: list[str]) -> bool:
        """A tag format's merge starts like the first child's own sequence
        (the parent's context, the child's start, its output): when the KV
        blocks that child filled with what the two share go past what the
        parent computed (it holds its blocks), the parent resumes through
        the prefix cache and reuses them."""
        if self.hooks.tag_format is None or not children:
            return False
        node = self.fork_join.tree.get(children[0])
        if node is None or node.state != MERGED or not node.sampled_tokens:
            return False
        tokens = st.request.all_token_ids
        context = node.prompt_tokens - len(node.start_tokens)  # parent tokens it starts with
        own = [*node.start_tokens, *(node.output_tokens or ())][: node.sampled_tokens + len(
            node.start_tokens)]
        start = min(context, keep)
        shared = start + common_prefix([*tokens[start:context], *own],
                                       [*tokens[start:keep], *merged])
        return first_child_covers(shared, node.prompt_tokens + node.sampled_tokens,
                                  st.request.num_computed_tokens, self.vllm.block_size)

    def _finish_after_join(self, st: HookState, merge: "_Merge", status: RequestStatus) -> None:
        """The parent finishes with its merge: a child gives it to its own
        parent, a request sends it (and its held stop token) to the client."""
        fj = self.fork_join
        req = st.request
        rid = req.request_id
        keep, merged = merge.keep, merge.tokens
        is_child = rid in fj.children
        rows = self._merge_rows(st, keep, merged, merge.record)
        tokens, text = self.contribution(st, merged, keep) if is_child else (None, None)
        stop_reason = st.final_stop_reason  # (resumed by _take_merge: it finishes now)
        if merge.frontier is not None:  # (vLLM frees the blocks it had computed)
            req.num_computed_tokens = merge.frontier
        self.vllm.finish([rid], status)
        if is_child:
            self._close_child(rid, st, FINISHED, tokens,
                              str(RequestStatus.get_finished_reason(status)), text)
            return
        held = [req.all_token_ids[st.stop_pos]] if st.stop_pos is not None else []
        if rows is not None and held:
            row = self.logprob_rows.withheld.pop(rid, None)
            rows.append(row if row is not None and row[0][0] == held[0] else forced_row(held[0]))
        out = EngineCoreOutput(
            request_id=rid,
            new_token_ids=[*merged, *held],
            finish_reason=RequestStatus.get_finished_reason(status),
            stop_reason=stop_reason,
            new_logprobs=as_lists(rows) if rows else None,
        )
        attach_trace(fj, out, self.metrics.engine)
        fj.drop_state(rid)
        fj.pending_outputs.append((req.client_index, out))


@dataclass(frozen=True)
class _Merge:
    """A join: the parent keeps its first ``keep`` tokens and goes on with
    ``tokens`` (cut to ``room``, what ``max_model_len`` left), from
    ``children``; ``ends_parent``: a child ended without its end tag and the
    format stops the parent there."""

    keep: int
    tokens: list[int]
    children: list[str]
    record: JoinRecord
    room: int
    ends_parent: bool
    #: How far its KV had reached when it was spilled (None: it held its
    #: blocks while it waited).
    frontier: int | None


def _resumed_params(st: HookState, remaining: int, shift: int = 0):
    """A resumed parent's sampling parameters: its remaining budget, the
    ``min_tokens`` it has left, and the tokens it sampled before."""
    sp = copy.copy(st.request.sampling_params)  # (see spawning._child_params)
    sp.max_tokens = remaining
    sp.min_tokens = max(0, st.orig_min_tokens - st.sampled)
    extra = dict(sp.extra_args or {})
    extra[SAMPLED_BEFORE_ARG] = st.sampled
    if shift:
        extra[POSITION_SHIFT_ARG] = shift
    sp.extra_args = extra
    return sp
