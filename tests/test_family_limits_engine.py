"""Family limits, deadlines and fair share in the scheduler (surgical
harness: scripted tokens, counted in steps, sync and async scheduling).

The fork bomb (tests.support.fork_bomb): one request writes 16
promises, each child 16 more, each grandchild N tokens; a plain request
arrives once the first level has spawned. Why the plain request stays
within 2x its steps alone: while it waits, fair share holds the bomb's
children at half of the 16 slots and preempts the newest bomb child when no
slot is free, so it is admitted at the next step; once running it decodes
every step (no KV pressure here), like alone.
"""

from __future__ import annotations

import pytest

from vllm.v1.engine import FinishReason

from vllm_seqhooks.core.batch_order import family_of
from vllm_seqhooks.core.child_queue import ChildrenFirst
from vllm_seqhooks.core.family_limits import (
    CHILD_TIMEOUT,
    DEADLINE,
    DESCENDANTS,
    ENGINE_LIVE,
    FAMILY_LIVE,
    TOKEN_BUDGET,
)
from tests.support.fork_bomb import (
    BOMB_ID,
    LIMITS_OFF,
    PLAIN_ID,
    promises,
    run_fork_bomb,
)
from tests.support.sched_harness import (
    EOS_ID as EOS,
    SEP_ID as SEP,
    FAILED_MARKER_IDS,
    SYNC_ID as S,
    SchedHarness,
    child_id,
)

MODES = pytest.mark.parametrize("async_sched", [False, True], ids=["sync", "async"])


def assert_idle(h: SchedHarness) -> None:
    """Every request finished, no hook state, no KV block, no stray output."""
    sched = h.sched
    assert not sched.requests, list(sched.requests)
    assert not sched.running and not sched.waiting and not sched.kv_holding_waiting
    assert sched.num_waiting_for_streaming_input == 0
    sizes = sched.hook_state_sizes()
    assert sizes == {k: 0 for k in sizes}, sizes
    assert sched.kv_cache_manager.usage == 0
    assert not h.outputs_after_finish
    assert not [r for r in h.all_output_ids() if "@seqhooks-child" in r]


def ignored_reasons(trace: dict) -> list[str]:
    out = []

    def walk(node):
        out.extend(p["reason"] for p in node.get("ignored_promises", ()))
        for c in node["children"]:
            walk(c)

    walk(trace)
    return out


# ---------------------------------------------------------------- fork bomb
@MODES
@pytest.mark.parametrize("leaf_tokens", [200, 800])
def test_plain_request_beside_a_fork_bomb_within_2x(async_sched, leaf_tokens):
    r = run_fork_bomb(async_sched, leaf_tokens=leaf_tokens)
    assert r.plain_alone_steps >= 32
    assert r.plain_steps <= 2 * r.plain_alone_steps, (r.plain_steps, r.plain_alone_steps)
    # The bomb stays within its family budget: (1 + 16) x 1000 tokens,
    # of which its own 1000 are reserved for it.
    trace = r.harness.trace(BOMB_ID)
    assert trace["limits"]["token_budget"] == 17 * 1000
    assert r.family_sampled_tokens <= 17 * 1000
    assert r.descendant_sampled_tokens <= 16 * 1000
    assert trace["usage"]["family_sampled_tokens"] == r.family_sampled_tokens
    assert trace["limits"]["exhausted_by"] == TOKEN_BUDGET
    assert r.harness.finish_reasons[PLAIN_ID] == FinishReason.LENGTH
    assert len(r.harness.tokens[PLAIN_ID]) == 32
    if not async_sched:
        # Every slot was taken when it arrived.
        assert r.harness.sched.hook_stats["fair_share_preemptions"] >= 1
    assert_idle(r.harness)


def test_without_fair_share_the_bomb_starves_the_plain_request():
    """The control: the same scenario with fair share off (the budget still
    bounds the bomb)."""
    r = run_fork_bomb(False, leaf_tokens=200, hooks={"fair_share": False})
    assert r.plain_steps > 10 * r.plain_alone_steps
    assert r.descendant_sampled_tokens <= 16 * 1000


def test_without_limits_the_bomb_samples_fifty_times_its_request():
    """Before this change (budget and fair share off): what the issue
    measured, so the limits above are what bounds it."""
    r = run_fork_bomb(False, leaf_tokens=200, hooks=dict(LIMITS_OFF))
    assert r.descendants == 16 + 16 * 16
    assert r.descendant_sampled_tokens > 50 * 1000


@pytest.mark.parametrize("bomb_priority,plain_priority,protected", [
    (1, 0, True), (0, 0, True), (0, 1, False),
])
def test_priority_policy_between_families(bomb_priority, plain_priority, protected):
    r = run_fork_bomb(False, leaf_tokens=200, policy="priority",
                      bomb_priority=bomb_priority, plain_priority=plain_priority)
    if protected:
        assert r.plain_steps <= 2 * r.plain_alone_steps
    else:
        # A more urgent family keeps its slots.
        assert r.plain_steps > 2 * r.plain_alone_steps
    assert_idle(r.harness)


@MODES
def test_fork_bomb_with_a_tight_kv_cache_finishes_without_leaks(async_sched):
    r = run_fork_bomb(async_sched, leaf_tokens=60, num_blocks=48, max_model_len=512,
                      bomb_max_tokens=300)
    h = r.harness
    assert h.finish_reasons[PLAIN_ID] == FinishReason.LENGTH
    assert BOMB_ID in h.finish_reasons
    assert r.family_sampled_tokens <= 17 * 300
    assert_idle(h)


# ------------------------------------------------------------ token budget
P, E = 4, 5  # <promise>, </promise> of the tiny model


@MODES
def test_family_budget_cuts_descendants_with_length(async_sched):
    h = SchedHarness(async_sched, scripts={
        "r": [P, 40, E, P, 41, E, S, 50, EOS],
        # Children never stop by themselves (filler past the script).
        child_id("r", 0): [],
        child_id("r", 1): [],
    })
    h.add("r", [10, 11, 12], max_tokens=100,
          extra_args={"seqhooks_max_family_tokens": 100 + 30})
    h.run(max_steps=200)
    trace = h.trace("r")
    kids = trace["children"]
    assert sum(c["sampled_tokens"] for c in kids) == 30
    assert [c["finish_reason"] for c in kids] == ["length", "length"]
    assert trace["limits"]["exhausted_by"] == TOKEN_BUDGET
    assert trace["limits"]["descendant_tokens"] == 30
    # Both outputs are merged; the request resumes on its own budget.
    merged = kids[0]["output_token_ids"] + [SEP] + kids[1]["output_token_ids"]
    sync_at = h.tokens["r"].index(S)
    assert h.tokens["r"][sync_at + 1: sync_at + 1 + len(merged)] == merged
    assert h.tokens["r"][-2:] == [50, EOS]
    assert h.finish_reasons["r"] == FinishReason.STOP
    assert_idle(h)


@MODES
def test_budget_cut_reaches_a_parked_child_which_finishes(async_sched):
    c0 = child_id("r", 0)
    h = SchedHarness(async_sched, hooks={"max_child_depth": 2}, scripts={
        "r": [P, 40, E, S, 50, EOS],
        c0: [P, 41, E, S, 60, EOS],
        child_id(c0, 0): [],  # runs until cut
    })
    h.add("r", [10, 11, 12], max_tokens=60,
          extra_args={"seqhooks_max_family_tokens": 60 + 20})
    h.run(max_steps=200)
    trace = h.trace("r")
    child = trace["children"][0]
    grandchild = child["children"][0]
    assert grandchild["finish_reason"] == "length"
    # The parked child joined its cut child and finished without resuming.
    assert child["finish_reason"] == "length"
    assert child["sampled_tokens"] + grandchild["sampled_tokens"] == 20
    assert 60 not in child["output_token_ids"]
    assert h.finish_reasons["r"] == FinishReason.STOP
    assert_idle(h)


@MODES
def test_promise_after_the_budget_is_spent_stays_text(async_sched):
    h = SchedHarness(async_sched, scripts={
        "r": [P, 40, E, S, P, 41, E, S, EOS],
        child_id("r", 0): [70] * 10 + [EOS],
    })
    h.add("r", [10, 11, 12], max_tokens=30,
          extra_args={"seqhooks_max_family_tokens": 30 + 5})
    h.run(max_steps=200)
    trace = h.trace("r")
    assert len(trace["children"]) == 1
    assert ignored_reasons(trace) == [TOKEN_BUDGET]
    assert trace["limits"]["ignored_promises"] == {TOKEN_BUDGET: 1}
    assert_idle(h)


# ------------------------------------------------------------ spawn limits
@pytest.mark.parametrize("hooks,extra,reason,spawned", [
    ({}, {"seqhooks_max_descendants": 2}, DESCENDANTS, 2),
    ({"max_descendants": 3}, {}, DESCENDANTS, 3),
    ({"max_live_children_per_family": 1}, {}, FAMILY_LIVE, 1),
    ({"max_live_children": 2}, {}, ENGINE_LIVE, 2),
])
def test_spawn_limits_leave_promises_as_text(hooks, extra, reason, spawned):
    h = SchedHarness(False, hooks=hooks, scripts={
        "r": promises(4, 30) + [EOS],
        **{child_id("r", i): [70 + i] * 30 + [EOS] for i in range(4)},
    })
    h.add("r", [10, 11, 12], max_tokens=100, extra_args=extra)
    h.run(max_steps=300)
    trace = h.trace("r")
    assert len(trace["children"]) == spawned
    assert ignored_reasons(trace) == [reason] * (4 - spawned)
    assert h.sched.hook_stats["promises_ignored"] == 4 - spawned
    assert_idle(h)


# --------------------------------------------------------------- deadlines
class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def timed_harness(async_sched, scripts, **kwargs):
    h = SchedHarness(async_sched, scripts=scripts, **kwargs)
    clock = Clock()
    h.sched.family_limits.clock = clock
    return h, clock


@MODES
def test_child_timeout_fails_the_child_and_the_parent_resumes(async_sched):
    h, clock = timed_harness(async_sched, {
        "r": [P, 40, E, P, 41, E, S, 50, EOS],
        child_id("r", 0): [71, EOS],
        child_id("r", 1): [],  # would run 200 tokens
    }, hooks={"failed_child_marker": "<failed>"})
    h.add("r", [10, 11, 12], max_tokens=200, arrival_time=0.0,
          extra_args={"seqhooks_child_timeout_s": 5})
    h.run_until(lambda: h.sched.hook_state_sizes()["parked"] == 1, max_steps=50)
    clock.now = 5.0
    h.run(max_steps=50)
    trace = h.trace("r")
    slow = trace["children"][1]
    assert slow["state"] == "failed" and slow["finish_reason"] == CHILD_TIMEOUT
    assert slow["sampled_tokens"] < 40
    assert trace["limits"]["timed_out_children"] == 1
    sync_at = h.tokens["r"].index(S)
    assert h.tokens["r"][sync_at + 1:] == [71, SEP, *FAILED_MARKER_IDS, 50, EOS]
    assert h.sched.hook_stats["child_timeouts"] == 1
    assert_idle(h)


@MODES
def test_family_timeout_cuts_descendants_and_finishes_the_request(async_sched):
    h, clock = timed_harness(async_sched, {
        "r": [P, 40, E, S, 50, EOS],
        child_id("r", 0): [],
    })
    h.add("r", [10, 11, 12], max_tokens=200, arrival_time=0.0,
          extra_args={"seqhooks_family_timeout_s": 1.5})
    h.run_until(lambda: h.sched.hook_state_sizes()["parked"] == 1, max_steps=50)
    for _ in range(5):  # the child samples a few tokens
        h.step()
    clock.now = 1.5
    h.run(max_steps=50)
    trace = h.trace("r")
    child = trace["children"][0]
    assert child["finish_reason"] == "length" and child["state"] == "merged"
    assert trace["limits"]["exhausted_by"] == DEADLINE
    # The request finishes with what it has: the merge, no resume.
    assert h.finish_reasons["r"] == FinishReason.LENGTH
    assert 50 not in h.tokens["r"]
    assert h.tokens["r"][-len(child["output_token_ids"]):] == child["output_token_ids"]
    assert h.sched.hook_stats["family_deadlines"] == 1
    assert_idle(h)


@MODES
def test_family_timeout_stops_a_running_request(async_sched):
    h, clock = timed_harness(async_sched, {"r": [60] * 100},
                             hooks={"family_timeout_s": 3.0})
    h.add("r", [10, 11, 12], max_tokens=200, arrival_time=0.0,
          extra_args={})
    h.run_until(lambda: len(h.tokens.get("r", ())) > 30, max_steps=200)
    clock.now = 3.0
    steps = h.run(max_steps=10)
    assert steps <= 3
    assert h.finish_reasons["r"] == FinishReason.LENGTH
    assert len(h.tokens["r"]) < 40
    assert_idle(h)


# ------------------------------------------------------------- KV pressure
@MODES
def test_kv_pressure_every_family_finishes_children_wait_family_by_family(async_sched):
    """``8`` families (64-token prompts, 2 children of 24 tokens, a short
    continuation) on a 24-block cache, where at most ~5 parents fit at once.
    Parked parents spill when the next waiting request cannot get blocks;
    every family gets the tokens of an unpressured run, nothing leaks. At
    every step the waiting children, preempted ones included, wait family by
    family, oldest family first, ahead of every request that has not
    started."""
    h = SchedHarness(async_sched, num_blocks=24)
    for i in range(8):
        rid = f"f{i}"
        h.scripts[rid] = [P, 40, E, P, 41, E, S] + [50] * 8 + [EOS]
        for j in range(2):
            h.scripts[child_id(rid, j)] = [60 + j] * 24 + [EOS]
        h.add(rid, [10 + i] * 64, max_tokens=100)
    grouped = 0

    def check_queue() -> bool:
        nonlocal grouped
        children = h.sched.fork_join.children
        fresh_children, new_requests = [], []
        for k, req in enumerate(h.sched.waiting):
            if req.request_id in children:
                fresh_children.append((k, family_of(req.request_id)))
            elif not req.num_output_tokens and not req.num_preemptions:
                new_requests.append(k)
        if fresh_children and new_requests:
            assert fresh_children[-1][0] < new_requests[0]
        queue = h.sched.waiting
        assert isinstance(queue, ChildrenFirst)
        if queue._leading is not None:  # the count it places children by
            assert queue._leading == next(
                (k for k, r in enumerate(queue) if r.request_id not in children), len(queue))
        families = [f for _, f in fresh_children]
        runs = [f for k, f in enumerate(families) if k == 0 or families[k - 1] != f]
        assert runs == sorted(runs) and len(runs) == len(set(runs)), families
        grouped += len(families) > len(runs)
        return False

    h.run(max_steps=3000, until=check_queue)
    expected = [P, 40, E, P, 41, E, S, *([60] * 24), SEP, *([61] * 24), *([50] * 8), EOS]
    for i in range(8):
        assert h.tokens[f"f{i}"] == expected
    assert h.sched.hook_stats["spills"] >= 1
    assert grouped  # siblings did wait together
    assert_idle(h)
