"""What joins and forks cost: tokens prefilled at a join (only ``<sync>``
and the merged tokens, ideally) and prompt tokens a child found cached."""

from __future__ import annotations


class AccountingMixin:
    """Counts join prefill and fork cache hits per step."""

    def _account(self, out) -> None:
        scheduled = out.num_scheduled_tokens
        drafts = out.scheduled_spec_decode_tokens
        for rid in list(self._accounting):
            n = scheduled.get(rid)
            if not n:
                continue
            # Draft positions (vLLM pads a resumed decode with placeholder
            # drafts) are verified, not prefilled.
            n -= len(drafts.get(rid, ()))
            st = self._accounting[rid]
            rec = st.accounting
            if rec is None:
                self._accounting.pop(rid, None)
                continue
            if rec.prefilled_tokens is None:
                rec.prefilled_tokens = 0
                rec.reused_tokens = st.request.num_computed_tokens - n
                self.metrics.inc("join_reused_tokens", rec.reused_tokens)
            rec.prefilled_tokens += n
            self.metrics.inc("join_prefill_tokens", n)
            if not st.request.is_prefill_chunk:
                self._accounting.pop(rid, None)
        for rid, child in self._children.items():
            st = self._hook_states.get(rid)
            if st is None or st.first_scheduled:
                continue
            n = scheduled.get(rid)
            if not n:
                continue
            st.first_scheduled = True
            cached = child.num_computed_tokens - n
            node = self.deps.get(rid)
            if node is not None:
                node.cached_prompt_tokens = cached
            self.metrics.inc("fork_cached_tokens", cached)
