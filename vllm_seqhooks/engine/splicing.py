"""Splice joins (``join="splice"``): a tag format's parent takes the KV its
children computed instead of prefilling their outputs again
(docs/formats/splice.md; the positions and attention are those of
:mod:`vllm_seqhooks.core.splice_layout`).

- A child that finished keeps its KV blocks (and its ``Request``) until its
  parent's join step is scheduled. A child that ended at its end tag first
  computes that tag's KV: it runs one more step, whose sampled token is
  dropped (``drain``).
- At the join the parent's new tokens are the fork tag's last token, each
  path (the child's tokens after the shared context, as far as it computed
  them) and the format's suffix; all but the suffix count as computed.
  With the prefix cache on, the parent adopts its first child's whole
  blocks of its context and first path (and their block hashes); the rest
  is copied slot by slot from the children's blocks into the parent's
  fresh blocks
  (:class:`~vllm_seqhooks.core.splice_inputs.SpliceInputs`, carried out by
  the workers before its next step's forward pass).
- The parent then holds more tokens than positions: its positions run
  behind its indices as ``maps[rid]`` says (:class:`SpliceMap`), whose
  shifts for the tokens it computes go with every step it is scheduled in,
  whether it computes them for the first time or again; its children
  inherit it. Tokens of a spliced path computed again (a preempted request
  or a child whose blocks were not in the prefix cache) are computed with
  causal attention: counted (``splice_recomputed_tokens``) and traced. Its block hashes are salted from
  the join on, so its spliced blocks are never served from the prefix cache
  to a request whose attention differs (its own later children share them
  through ``share_block_hashes``).
- At the join the parent takes blocks for all its tokens after it at once;
  while they are not free and other requests run, the join waits a step
  (``waits_for_blocks``). A parent whose KV was spilled while it waited
  (KV pressure) takes its context's whole blocks back from the prefix
  cache, and fresh ones into which the rest of its context is copied from
  its first child (whose context it is), with the paths
  (``splice_context_copied``).
- A join falls back to re-prefill (counted, and said in the trace) when a
  path's KV is not all there (a child that failed or ran out of tokens, or
  gave its held blocks back because nothing ran and a waiting request
  needed them), when its blocks are not free and nothing else runs, or
  when the merge passes ``max_model_len``.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Callable

from vllm.v1.request import Request, RequestStatus

from vllm_seqhooks.core.kv_blocks import blocks_holding
from vllm_seqhooks.core.splice_inputs import SpliceInputs
from vllm_seqhooks.core.splice_map import SpliceMap, SplicePath
from vllm_seqhooks.config.special_kwargs import SpecialKwargs
from vllm_seqhooks.engine import vllm_private
from vllm_seqhooks.engine.lifecycle import PARKED_WITH_BLOCKS, Phase
from vllm_seqhooks.engine.metrics import HookMetrics
from vllm_seqhooks.engine.parking import Parking
from vllm_seqhooks.engine.state import ForkJoinState
from vllm_seqhooks.engine.vllm_private import SchedulerPort

logger = logging.getLogger("vllm.seqhooks.scheduler")


@dataclass
class _Copies:
    """A request's KV copies, made when it is next scheduled: its token
    ``indices[i]`` takes request ``sources[i][0]``'s token ``sources[i][1]``
    (a parent's paths from its children at a join, or a child's context
    from its parent); ``children``: held children whose blocks then go."""

    indices: list[int]
    sources: list[tuple[str, int]]
    children: list[str]
    #: Its tokens with KV after the copies (the fork tag and the paths).
    computed: int


class Splicing:
    """Splice joins: children's KV held, planned into their parent's
    blocks at its join, copied and shifted in the steps that follow.
    ``text_codec()``: the engine's text codec (for the merge suffix)."""

    def __init__(self, fork_join: ForkJoinState, hooks: SpecialKwargs, metrics: HookMetrics,
                 vllm: SchedulerPort, parking: Parking, text_codec: Callable) -> None:
        self.fork_join = fork_join
        self.hooks = hooks
        self.metrics = metrics
        self.vllm = vllm
        self.parking = parking
        self.text_codec = text_codec
        self.enabled = hooks.join == "splice"
        #: Finished children whose blocks their parent has not taken yet,
        #: and the map each ended with (a path that forked in turn spans
        #: fewer positions than tokens).
        self.held: dict[str, Request] = {}
        self.held_maps: dict[str, SpliceMap] = {}
        #: Parents whose copies go with their next scheduled step.
        self.pending: dict[str, _Copies] = {}
        #: The map of each request whose positions run behind its token
        #: indices (after a splice join, and its descendants).
        self.maps: dict[str, SpliceMap] = {}
        self._suffix_len: int | None = None
        #: Parents on their first child's blocks: (that child, tokens).
        self.adopted: dict[str, tuple[str, int]] = {}

    @property
    def busy(self) -> bool:
        """Whether some request's blocks or positions are the splice
        joins' to look after."""
        return bool(self.held or self.pending or self.maps or self.adopted)

    # ---------------------------------------------------------- children
    def drains(self, child_id: str) -> bool:
        """A child that ends at its end tag computes the tag's KV first."""
        return self.enabled and child_id in self.fork_join.children

    def hold(self, request: Request) -> bool:
        """Keep a finished child's blocks for its parent (True: held)."""
        if (not self.enabled or request.request_id not in self.fork_join.children
                or request.status != RequestStatus.FINISHED_STOPPED):
            return False
        self.held[request.request_id] = request
        self.held_maps[request.request_id] = self.maps.get(request.request_id, SpliceMap())
        return True

    def inherit(self, parent_id: str, child_id: str) -> None:
        parent = self.maps.get(parent_id)
        if parent:
            self.maps[child_id] = parent

    def final_shift(self, request_id: str) -> int:
        """How far the positions of a request's next tokens run behind."""
        found = self.maps.get(request_id)
        return found.final if found is not None else 0

    def forget(self, request_id: str) -> None:
        """A request is freed: its shift goes, and the blocks held for it
        (a parent that ended before its join step)."""
        self.maps.pop(request_id, None)
        self.adopted.pop(request_id, None)
        copies = self.pending.pop(request_id, None)
        if copies is not None:
            self._release(copies.children)
        tree = self.fork_join.tree
        orphans = [cid for cid in self.held
                   if (node := tree.get(cid)) is None or node.parent_id == request_id]
        if orphans and request_id not in self.held:
            self._release(orphans)

    def give_back(self, child_ids) -> None:
        """A join that re-prefills: its children's held blocks go back."""
        self._release(child_ids)
        self.metrics.inc("splice_fallbacks", 1)

    def release_held_for(self, needs_blocks,
                         why: str = "nothing runs and the next waiting request needs them"
                         ) -> None:
        """KV pressure with nothing running (or a prefix-cache reset, ``why``
        says which): finished children give their held blocks back, oldest
        first, while ``needs_blocks()`` (the next waiting request cannot
        start); not those a join already planned its copies from. Their
        parents' joins re-prefill."""
        merging = {cid for copies in self.pending.values() for cid in copies.children}
        for cid in [c for c in self.held if c not in merging]:
            if not needs_blocks():
                return
            self._release([cid])
            self.metrics.inc("splice_holds_released", 1)
            logger.info("%s gives its held KV blocks back (%s); its parent's join "
                        "re-prefills", cid, why)

    def _release(self, child_ids) -> None:
        for cid in child_ids:
            request = self.held.pop(cid, None)
            self.held_maps.pop(cid, None)
            if request is not None:
                self.vllm.free_held_blocks(request)

    # -------------------------------------------------------------- join
    def merge(self, st, keep: int, children: list[str], suffix: list[int],
              record) -> tuple[list[int] | None, str | None]:
        """The tokens a parked parent goes on with when it splices
        ``children`` after its first ``keep`` tokens (its fork tag's last
        token, then each path, then ``suffix``), with its copies planned and
        its shift set; or None and why the join must re-prefill (the held
        blocks of the children are then given back). A parent whose KV was
        spilled while it waited takes blocks for its first ``keep`` tokens
        again (``record.splice_context_copied`` says how many it copies)."""
        req = st.request
        rid = req.request_id
        context = keep + 1  # its tokens, the fork tag's last included
        spilled = st.phase is Phase.SPILLED
        paths, reason = self._paths(st, keep, children)
        merged = [req.all_token_ids[keep]] + [t for _, p in paths for t in p] + list(suffix)
        if reason is None and keep + len(merged) > self.vllm.max_model_len:
            reason = "the merge passes max_model_len"
        first, first_end = (paths[0][0], context + len(paths[0][1])) if paths else (None, 0)
        have = None if reason is not None else self._allocate(
            st, keep, keep + len(merged), first, first_end)
        if reason is None and have is None:
            reason = (f"no free KV blocks for its merge"
                      f"{' and its context (its KV was spilled)' if spilled else ''}")
        if reason is not None:
            self.give_back(children)
            logger.debug("%s joins by re-prefill: %s", rid, reason)
            return None, reason
        if spilled:
            record.splice_after_spill = True
            record.splice_context_copied = max(0, context - have)
            self.metrics.inc("splice_joins_after_spill", 1)
        if have > context:
            record.splice_adopted_tokens = have - context
            self.metrics.inc("splice_adopted_tokens", have - context)
        # Its tokens with no KV yet come from the children: its own (the
        # fork tag's last, and after a spill what the prefix cache did not
        # keep) from the first child, whose context they are; each path
        # from its child, past what the first child's adopted blocks hold.
        indices = list(range(have, context))
        sources = [(first, i) for i in indices]
        at = context
        for cid, path in paths:
            skip = max(0, have - at)
            indices += range(at + skip, at + len(path))
            sources += [(cid, context + j) for j in range(skip, len(path))]
            at += len(path)
        self.pending[rid] = _Copies(indices, sources, list(children), at)
        laid, at = [], context
        for cid, path in paths:
            laid.append(SplicePath(at, len(path), self.held_maps.get(cid, SpliceMap())))
            at += len(path)
        joined = self.maps.get(rid, SpliceMap()).after_join(context, laid)
        if joined:
            self.maps[rid] = joined
        vllm_private.salt_block_hashes(req, _salt(rid))
        self.metrics.inc("splice_joins", 1)
        self.metrics.inc("spliced_tokens", at - context + 1)
        return merged, None

    def _paths(self, st, keep: int,
               children: list[str]) -> tuple[list[tuple[str, list[int]]], str | None]:
        """Each child's path (its tokens after the parent's context), as far
        as its held KV goes; and why the join cannot splice, if it cannot."""
        req = st.request
        tree = self.fork_join.tree
        context = keep + 1
        reason = None
        if st.phase is Phase.SPILLED:
            if req.num_computed_tokens:
                reason = "the parent's KV was spilled in a step still in flight"
        elif req.num_computed_tokens != keep:
            reason = "the parent's KV does not end at its fork"
        paths: list[tuple[str, list[int]]] = []
        for cid in children:
            child = self.held.get(cid)
            node = tree.get(cid)
            if child is None or node is None:
                reason = reason or (f"child {cid} has no KV to give (it ran out of tokens, "
                                    "or gave its blocks back under KV pressure)")
                continue
            end = context + len(node.start_tokens) + len(node.output_tokens or ())
            if child.num_computed_tokens < end or (
                    child.all_token_ids[:context] != req.all_token_ids[:context]):
                reason = reason or f"child {cid}'s KV is not all there"
                continue
            paths.append((cid, child.all_token_ids[context:end]))
        return paths, reason

    def _allocate(self, st, keep: int, num_tokens: int, first: str,
                  first_end: int) -> int | None:
        """The parent takes KV blocks for its tokens after the join now
        (:func:`~vllm_seqhooks.engine.vllm_private.allocate_join_blocks`).
        With the prefix cache on, it adopts its first child's whole blocks
        of the context and first path (``first_end`` tokens: the same tokens
        as its own there) when they go past its own whole blocks, giving
        back its own first; a parent whose KV was spilled takes blocks back
        and waits again as one holding KV. Returns how many of its tokens
        have their KV already; None when the blocks are not free."""
        req = st.request
        vllm = self.vllm
        size = vllm.block_size
        spilled = st.phase is Phase.SPILLED
        adopt = first_end // size * size if vllm.enable_caching and first else 0
        if adopt <= keep // size * size or (blocks_holding(num_tokens, size) - adopt // size
                                           > vllm.num_free_blocks()):
            adopt = 0
        elif not spilled:
            self.parking.spill(st)  # its own blocks go: it takes the child's
        have = vllm_private.allocate_join_blocks(vllm.kv_cache_manager, req, num_tokens, size,
                                                 first, adopt)
        if have is None or st.phase is not Phase.SPILLED:
            return have
        req.num_computed_tokens = keep
        self.fork_join.lifecycle.unspill(st)
        if adopt:
            self.adopted[req.request_id] = (first, adopt)
        if spilled:
            logger.info("%s joins by splice after its KV was spilled: %d tokens' KV back, "
                        "%d copied from its first child", req.request_id, min(have, keep + 1),
                        max(0, keep + 1 - have))
        return have

    def resumed(self, request) -> None:
        """A parent resumed on adopted blocks takes their block hashes."""
        adopted = self.adopted.pop(request.request_id, None)
        if adopted is not None:
            donor, tokens = adopted
            vllm_private.adopt_block_hashes(request, self.held[donor], tokens,
                                            self.vllm.hash_block_size,
                                            self.vllm.hash_lookahead)

    def waits_for_blocks(self, rid: str) -> bool:
        """Whether a parent whose children have all ended waits a step
        before its splice join: the blocks its merge needs are not free
        while other requests run (they free blocks as they finish or are
        preempted for one another). With nothing running it joins at once,
        and re-prefills if the blocks are still not there (its children's
        held blocks go back then): never a wait nothing can end."""
        st = self.fork_join.states.get(rid)
        if not self.enabled or not self.vllm.running or st is None or st.fork is None:
            return False
        tree = self.fork_join.tree
        tokens = st.fork.pos + 1 + self._suffix_tokens()
        for cid in tree.get(rid).open_children:
            node = tree.get(cid)
            if cid not in self.held or node is None:
                return False  # it re-prefills: nothing to wait for
            tokens += len(node.start_tokens) + len(node.output_tokens or ())
        size = self.vllm.block_size
        held = 0 if st.phase is Phase.SPILLED else blocks_holding(
            st.request.num_computed_tokens, size)
        need = blocks_holding(tokens, size) - held
        return need > self.vllm.num_free_blocks()

    def _suffix_tokens(self) -> int:
        if self._suffix_len is None:
            codec = self.text_codec()
            self._suffix_len = len(codec.encode(self.hooks.merge_suffix or ""))
        return self._suffix_len

    def child_context_hit(self, request, found, max_hit: int | None = None):
        """A child's prefix-cache hit (``_get_local_prefix_cache_hit``'s
        answer), extended to its parked parent's computed tokens, so that
        the child computes only its own (the fork tag's last and its
        header) and its context's KV is exactly its parent's, spliced paths
        included. With the prefix cache on, when the hit reaches the
        parent's last, partly filled block, that block ends the hit (vLLM
        copies it on write for the child); with it off, the whole context
        is copied slot by slot from the parent's blocks into the child's
        before its first step. ``max_hit``: a cap vLLM put on the hit (vLLM
        0.33's ``max_cache_hit_length``): no longer hit past it."""
        vllm = self.vllm
        blocks, hits, boundary, diverged = found
        self.pending.pop(request.request_id, None)  # from an admission that failed
        node = self.fork_join.tree.get(request.request_id)
        parent_id = node.parent_id if node is not None else None
        st = self.fork_join.states.get(parent_id)
        if st is None or st.phase not in PARKED_WITH_BLOCKS:
            return found
        parent = st.request
        have = parent.num_computed_tokens
        if max_hit is not None and have > max_hit:
            return found
        size = vllm.block_size
        if vllm.enable_caching:
            if have % size == 0 or hits != have - have % size:
                return found
        elif not have:
            return found
        if (request.num_tokens <= have
                or request.all_token_ids[hits:have] != parent.all_token_ids[hits:have]):
            return found
        self.metrics.inc("splice_child_context_copied_tokens", have - hits)
        if vllm.enable_caching:
            blocks = vllm_private.hit_with_partial_block(
                vllm.kv_cache_manager, blocks, parent_id, have // size)
        else:
            indices = list(range(have))
            self.pending[request.request_id] = _Copies(
                indices, [(parent_id, i) for i in indices], [], have)
        return blocks, have, boundary, diverged

    def computed_after(self, rid: str) -> int | None:
        """How many of a just-spliced parent's tokens count as computed."""
        copies = self.pending.get(rid)
        return copies.computed if copies is not None else None

    # -------------------------------------------------------------- steps
    def attach(self, out) -> None:
        """Give a scheduled step its KV copies and position shifts."""
        scheduled = out.num_scheduled_tokens
        shifts = self._step_shifts(scheduled)
        copy_from: list[int] = []
        copy_to: list[int] = []
        done = [rid for rid in self.pending if rid in scheduled]
        for rid in done:
            copies = self.pending.pop(rid)
            slots = self._slots(rid)
            source_slots = {sid: self._slots(sid) for sid in {sid for sid, _ in copies.sources}}
            copy_to += [slots(i) for i in copies.indices]
            copy_from += [source_slots[sid](i) for sid, i in copies.sources]
            self._release(copies.children)
        if shifts or copy_from:
            setattr(out, vllm_private.SPLICE_INPUTS_ATTR,
                    SpliceInputs(copy_from, copy_to, shifts))

    def _step_shifts(self, scheduled: dict[str, int]) -> dict[str, tuple]:
        """The shifts of the tokens each request with a map computes in a
        step just scheduled (vLLM counted them computed already); tokens of
        spliced paths computed again are counted and traced."""
        shifts = {}
        requests = self.vllm.requests
        for rid, smap in self.maps.items():
            count = scheduled.get(rid)
            if count is None:
                continue
            first = requests[rid].num_computed_tokens - count
            runs = smap.step_runs(first, count)
            if runs:
                shifts[rid] = runs
            again = smap.isolated_among(first, count)
            if again:
                self._recomputed(rid, again)
        return shifts

    def _recomputed(self, rid: str, tokens: int) -> None:
        node = self.fork_join.tree.get(rid)
        if node is not None:
            node.splice_recomputed_tokens += tokens
        self.metrics.inc("splice_recomputed_tokens", tokens)
        logger.info("%s computes %d tokens of spliced paths again, with causal attention "
                    "(their KV blocks were gone from the prefix cache)", rid, tokens)

    def _slots(self, rid: str):
        blocks = self.vllm.block_ids(rid)
        size = self.vllm.block_size
        return lambda index: blocks[index // size] * size + index % size

    def sizes(self) -> dict[str, int]:
        return {"splice_held": len(self.held) + len(self.held_maps),
                "splice_pending": len(self.pending) + len(self.adopted),
                "splice_maps": len(self.maps)}


def _salt(request_id: str) -> bytes:
    return hashlib.sha256(b"seqhooks-splice:" + request_id.encode()).digest()
