"""Memory-aware admission applied: new families that the KV cache cannot
hold yet wait (see :mod:`vllm_seqhooks.kv_admission`), and each join
teaches the footprint of a join round."""

from __future__ import annotations

from vllm.v1.request import RequestStatus

from vllm_seqhooks.kv_admission import admit_families, blocks_for


class FamilyAdmissionMixin:
    """Holds back requests that would start a family the cache cannot hold."""

    def _family_admission_holds(self) -> list[str]:
        candidates: list[tuple[str, int]] = []
        block_size = self.block_size
        for req in self.waiting:
            rid = req.request_id
            st = self._hook_states.get(rid)
            if (st is None or st.family is None or rid in self._children
                    or req.status == RequestStatus.WAITING_FOR_STREAMING_REQ
                    or req.num_computed_tokens or req.num_preemptions or st.sampled):
                continue
            candidates.append((rid, blocks_for(req.num_tokens + 1, block_size)))
        if not candidates:
            return []
        new = {rid for rid, _ in candidates}
        admitted = admit_families(
            candidates,
            free_blocks=self.kv_cache_manager.block_pool.get_num_free_blocks(),
            growing_families=sum(1 for root in self._families
                                 if root not in new and self._family_growing(root)),
            footprint=self._join_footprint,
        )
        return [rid for rid, _ in candidates[len(admitted):]]

    def _family_growing(self, root_id: str) -> bool:
        """The family's next join round has not allocated its blocks yet:
        its request runs and may spawn (it has spawned, or this engine has
        seen joins: requests here do spawn), or a child of it has not
        started. While no request spawns, nothing is held: hooks on but
        unused schedule as stock vLLM."""
        st = self._hook_states.get(root_id)
        if st is None:
            return False
        if not st.parked:
            return self._join_footprint.joins_seen > 0 or bool(self.deps.children_of(root_id))
        for rid in self.deps.live_descendants(root_id):
            cst = self._hook_states.get(rid)
            if cst is not None and not cst.first_scheduled:
                return True
        return False

    def _observe_join(self, child_ids: list[str], merged_tokens: int) -> None:
        """A join round's footprint: the children's own blocks (prompt
        tokens not found cached, and what they sampled) and the merge's."""
        block_size = self.block_size
        blocks = 0
        for cid in child_ids:
            node = self.deps.get(cid)
            if node is None:
                continue
            own = node.prompt_tokens - (node.cached_prompt_tokens or 0) + (node.sampled_tokens or 0)
            blocks += blocks_for(own, block_size)
        self._join_footprint.observe(blocks)
