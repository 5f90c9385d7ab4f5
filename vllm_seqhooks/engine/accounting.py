"""What joins and forks cost, counted from each step's schedule: tokens a
parent prefilled at its join (only ``<sync>`` and the merged tokens, ideally)
and prompt tokens a child found cached at its fork."""

from __future__ import annotations

from vllm_seqhooks.engine.metrics import HookMetrics
from vllm_seqhooks.engine.state import ForkJoinState


class Accounting:
    """Counts join prefill and fork cache hits per step, into the joins'
    records and ``metrics``."""

    def __init__(self, fork_join: ForkJoinState, metrics: HookMetrics) -> None:
        self.fork_join = fork_join
        self.metrics = metrics

    def count(self, out) -> None:
        """Count what the step ``out`` (a scheduler output) schedules."""
        if self.fork_join.accounting:
            self._count_joins(out.num_scheduled_tokens, out.scheduled_spec_decode_tokens)
        if out.scheduled_new_reqs:
            self._count_forks(out.scheduled_new_reqs, out.num_scheduled_tokens)

    def _count_joins(self, scheduled: dict[str, int], drafts: dict) -> None:
        fj = self.fork_join
        metrics = self.metrics
        for rid in list(fj.accounting):
            n = scheduled.get(rid)
            if not n:
                continue
            # Draft positions (vLLM pads a resumed decode with placeholder
            # drafts) are verified, not prefilled.
            n -= len(drafts.get(rid, ()))
            st = fj.accounting[rid]
            rec = st.accounting
            if rec is None:
                fj.accounting.pop(rid, None)
                continue
            if rec.prefilled_tokens is None:
                rec.prefilled_tokens = 0
                rec.reused_tokens = st.request.num_computed_tokens - n
                metrics.inc("join_reused_tokens", rec.reused_tokens)
            rec.prefilled_tokens += n
            metrics.inc("join_prefill_tokens", n)
            if not st.request.is_prefill_chunk:
                fj.accounting.pop(rid, None)

    def _count_forks(self, new_reqs, scheduled: dict[str, int]) -> None:
        """A child's first schedule starts it from the waiting queue: it is
        among the step's new requests (vLLM lists a request scheduled from
        WAITING there), so only those are looked at, not every live child."""
        fj = self.fork_join
        for data in new_reqs:
            rid = data.req_id
            child = fj.children.get(rid)
            if child is None:
                continue
            st = fj.states.get(rid)
            if st is None or st.first_scheduled:
                continue
            n = scheduled.get(rid)
            if not n:
                continue
            st.first_scheduled = True
            cached = child.num_computed_tokens - n
            node = fj.tree.get(rid)
            if node is not None:
                node.cached_prompt_tokens = cached
            self.metrics.inc("fork_cached_tokens", cached)
