"""What a GPU-timed worker's model "samples", and what each step computes.

The worker runs no forward pass. It follows vLLM's scheduler outputs (the
requests that arrive, resume, finish; the tokens each step schedules) and,
for every request whose scheduled tokens reach the end of what it has, emits
the next token of the request's script: the same ``seqhooks_script`` keys
the scripted logits processor reads (:func:`forcing_plan`), so a workload
samples the same tokens here as on a real model forced by that processor.
An unscripted request samples ``filler_token`` until the engine stops it
(``max_tokens``, ``ignore_eos``: what ``vllm bench serve`` sends).

It also gives the step's batch as ``(scheduled, context_after)`` per request,
what :class:`.step_model.StepModel` prices. Duck-typed on vLLM's
``SchedulerOutput`` (``scheduled_new_reqs``, ``scheduled_cached_reqs``,
``num_scheduled_tokens``, ``finished_req_ids``); imports no vLLM itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class _Request:
    known: int          # tokens the request has: prompt + sampled so far
    sampled: int        # index, in its script, of the next token it samples
    plan: Any           # a ForcingPlan, or None


@dataclass(frozen=True)
class Step:
    batch: list[tuple[int, int]]          # (scheduled, context_after) per request
    req_ids: list[str]                    # in the scheduler output's order
    sampled: dict[str, int]               # the token each sampling request emits


class RequestTracker:
    """One per worker; :meth:`step` once per scheduler output, in order."""

    def __init__(self, plan_for: Callable[[Any], Any], filler_token: int) -> None:
        # plan_for(new request of the scheduler output) -> a ForcingPlan or None
        self._plan_for = plan_for
        self._filler = filler_token
        self._requests: dict[str, _Request] = {}

    def __len__(self) -> int:
        return len(self._requests)

    def step(self, out: Any) -> Step:
        for rid in out.finished_req_ids:
            self._requests.pop(rid, None)
        computed: dict[str, int] = {}
        for new in out.scheduled_new_reqs:
            plan = self._plan_for(new)
            self._requests[new.req_id] = _Request(
                len(new.prompt_token_ids or ()), plan.sampled_before if plan else 0, plan)
            computed[new.req_id] = new.num_computed_tokens
        cached = out.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            computed[rid] = cached.num_computed_tokens[i]
            if rid in cached.resumed_req_ids:
                req = self._requests[rid]
                tokens = cached.all_token_ids.get(rid)
                if tokens is not None:
                    req.known = len(tokens)
                before = req.plan.sampled_before if req.plan else 0
                req.sampled = before + cached.num_output_tokens[i]
        batch, order, sampled = [], [], {}
        for rid, scheduled in out.num_scheduled_tokens.items():
            context = computed[rid] + scheduled
            batch.append((scheduled, context))
            order.append(rid)
            req = self._requests[rid]
            if context >= req.known:
                token = req.plan.token_at(req.sampled) if req.plan else None
                sampled[rid] = self._filler if token is None else token
                req.sampled += 1
                req.known = context + 1
        return Step(batch, order, sampled)
