"""Hooks cost what changed: which requests get hook work in a step.

Counted, not timed (issue 20): the hook scheduler's per-request path
(``_update_watched``: cut, charge, scan, apply) runs only for requests that
have hook work in that step; a step in which no request has any is served
by vLLM's own ``_update_request_with_output`` for every request.
"""

from __future__ import annotations

import pytest

from vllm_seqhooks.testing.sched_harness import (
    EOS_ID as EOS,
    PROMISE_END_ID as E,
    PROMISE_ID as P,
    SYNC_ID as S,
    SchedHarness,
    child_id,
)

MODES = pytest.mark.parametrize("async_sched", [False, True], ids=["sync", "async"])


def prompt(n: int, base: int = 10) -> list[int]:
    return [base + i % 50 for i in range(n)]


def _count_hook_work(h: SchedHarness) -> list[list[str]]:
    """Per update_from_output, the request ids given the hook path."""
    sched = h.sched
    steps: list[list[str]] = []
    inner = sched._update_watched
    orig_update = sched.update_from_output

    def update(*args, **kwargs):
        steps.append([])
        return orig_update(*args, **kwargs)

    def watched(st, new_token_ids, is_stale):
        steps[-1].append(st.request.request_id)
        return inner(st, new_token_ids, is_stale)

    sched._update_watched = watched
    sched.update_from_output = update
    return steps


@MODES
def test_plain_requests_get_no_hook_work(async_sched):
    h = SchedHarness(async_sched)
    for i in range(6):
        h.add(f"r{i}", prompt(12, 10 + i), max_tokens=20)
    steps = _count_hook_work(h)
    h.run(max_steps=80)
    assert all(h.finish_reasons[f"r{i}"] is not None for i in range(6))
    assert len(steps) >= 20
    assert not any(steps), steps
    assert all(len(h.tokens[f"r{i}"]) == 20 for i in range(6))


@MODES
def test_hook_work_only_for_a_family_with_work(async_sched):
    h = SchedHarness(async_sched)
    for i in range(4):
        h.add(f"r{i}", prompt(12, 10 + i), max_tokens=40)
    h.add("f", prompt(12), max_tokens=12, script=[40, P, 41, E, 42, S, 43, 44, 45])
    h.scripts[child_id("f", 0)] = [60, 61, 62, EOS]
    steps = _count_hook_work(h)
    h.run(max_steps=120)
    touched = {rid for step in steps for rid in step}
    # Plain requests never get the hook path; the parent only while it has
    # hook work (the promise, its open child, the join). The child's whole
    # budget fits in its family's: it is charged when it ends, not as it
    # samples.
    assert touched == {"f"}
    assert h.trace("f")["limits"]["descendant_tokens"] == 4  # 60 61 62 EOS
    per_step = [len(step) for step in steps]
    assert sum(per_step) < 4 * len(steps)  # not one per live request per step
    # After the join's prefill is counted, the parent
    # is served by vLLM's own path: its last tokens get no hook work.
    assert steps[-1] == [] and steps[-2] == []
    # Its budget counts only what it sampled (12), across the join.
    assert h.tokens["f"][:12] == [40, P, 41, E, 42, S, 60, 61, 62, 43, 44, 45]
    assert len(h.tokens["f"]) == 12 + 3


@MODES
def test_children_charged_as_they_sample_once_budgets_do_not_fit(async_sched):
    """Budgets that do not all fit in the family's: every descendant is
    charged (and trimmed) as it samples, and the family is cut when they
    spend it, as before."""
    h = SchedHarness(async_sched, hooks={"family_token_factor": 2})
    h.add("f", prompt(12), max_tokens=10,
          script=[P, 41, E, P, 42, E, S, 43])
    h.scripts[child_id("f", 0)] = [60] * 30
    h.scripts[child_id("f", 1)] = [70] * 30
    steps = _count_hook_work(h)
    h.run(max_steps=120)
    touched = {rid for step in steps for rid in step}
    assert child_id("f", 1) in touched
    limits = h.trace("f")["limits"]
    assert limits["descendant_tokens"] == limits["descendant_token_budget"] == 10
    assert limits["exhausted_by"] == "family_token_budget"
