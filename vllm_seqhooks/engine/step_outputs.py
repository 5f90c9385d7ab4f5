"""The output side of a step: children's outputs stay in EngineCore (their
ends are noted), a request that parked in the step gets an unfinished
output, a finished root request's output carries its family's trace, and
the outputs made outside the step (merged tokens, finished parents) are
added after each request's own."""

from __future__ import annotations

from typing import Callable

from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason
from vllm.v1.request import Request

from vllm_seqhooks.core.request_tree import FAILED, FINISHED
from vllm_seqhooks.engine.family_trace import attach_trace
from vllm_seqhooks.engine.logprob_rows import LogprobRows, concat, rows_of
from vllm_seqhooks.engine.state import ForkJoinState

#: Finish reasons of a child that count as finished (else it failed).
_FINISHED_REASONS = (FinishReason.STOP, FinishReason.LENGTH, FinishReason.REPETITION)


class StepOutputs:
    """A step's outputs as clients see them: children's taken out (their
    ends go to ``child_ended``, see ``joins.Joins``), those of requests that
    parked unfinished, finished roots' with their traces, and the outputs
    made outside the step added."""

    def __init__(self, fork_join: ForkJoinState, logprob_rows: LogprobRows,
                 child_ended: Callable[[Request, str, FinishReason | None], None],
                 engine: str) -> None:
        self.fork_join = fork_join
        self.logprob_rows = logprob_rows
        self.child_ended = child_ended
        self.engine = engine

    def filter_outputs(self, outputs: dict[int, EngineCoreOutputs],
                       parked_now: set[str]) -> None:
        """Take children's outputs out of a step's ``outputs`` (noting the
        children that ended), keep the outputs of requests that parked in
        this step unfinished, and attach the trace of finished ones."""
        fj = self.fork_join
        children, ended = fj.children, fj.ended_children
        for eco in outputs.values():
            outs = eco.outputs
            # Most outputs are running children's or plain decodes: two
            # passes of membership tests, the per-output work only for the
            # few that finished or parked.
            for out in [o for o in outs if o.finish_reason is not None
                        or o.request_id in parked_now]:
                rid = out.request_id
                child = children.get(rid)
                if child is not None or rid in ended:
                    if child is not None and rid not in parked_now:
                        state = (FINISHED if out.finish_reason in _FINISHED_REASONS
                                 else FAILED)
                        self.child_ended(child, state, out.finish_reason)
                elif rid in parked_now:
                    self._unfinish(out)
                elif rid in fj.tree:
                    attach_trace(self.fork_join, out, self.engine)
            if children or ended:
                eco.outputs = [o for o in outs
                               if o.request_id not in children and o.request_id not in ended]
            if eco.finished_requests:
                eco.finished_requests = {
                    r for r in eco.finished_requests
                    if r not in children and r not in ended
                }

    def _unfinish(self, out: EngineCoreOutput) -> None:
        """A parked request's output of this step: not finished, and without
        the stop token it finished with (the frontend drops the last token of
        a stop-terminated output from the text, so it must come after the
        merged tokens) or the fork tag's last token (the join replaces it)."""
        out.finish_reason = None
        out.stop_reason = None
        st = self.fork_join.states.get(out.request_id)
        if (st is not None and (st.stop_pos is not None or st.fork is not None)
                and out.new_token_ids):
            out.new_token_ids = list(out.new_token_ids[:-1])
            if out.new_logprobs is not None:
                out.new_logprobs = self.logprob_rows.withhold(
                    out.request_id, out.new_logprobs, len(out.new_token_ids))

    def deliver_pending(self, outputs: dict[int, EngineCoreOutputs]) -> None:
        """Add the outputs made outside this step (merged tokens, finished
        parents) to it, after the request's own output of the step."""
        fj = self.fork_join
        for client_index, out in fj.pending_outputs:
            eco = outputs.get(client_index)
            if eco is None:
                eco = outputs[client_index] = EngineCoreOutputs()
            for existing in eco.outputs:
                if existing.request_id == out.request_id and existing.finish_reason is None:
                    if out.new_logprobs is not None:
                        existing.new_logprobs = concat(existing.new_logprobs, rows_of(
                            out.new_logprobs, len(out.new_token_ids)))
                    existing.new_token_ids = list(existing.new_token_ids) + list(out.new_token_ids)
                    existing.finish_reason = out.finish_reason
                    existing.stop_reason = out.stop_reason
                    existing.kv_transfer_params = out.kv_transfer_params
                    break
            else:
                eco.outputs.append(out)
        fj.pending_outputs = []
