"""The pure decisions behind family limits and fair share (no vLLM)."""

from __future__ import annotations

import math

import pytest

from vllm_seqhooks.config.special_kwargs import (
    SpecialKwargs,
    SpecialKwargsError,
)
from vllm_seqhooks.config.request_keys import parse_request_overrides
from vllm_seqhooks.core.request_tree import HookNode, JoinRecord
from vllm_seqhooks.core.trace import family_usage
from vllm_seqhooks.core.fair_share import Entry, plan
from vllm_seqhooks.core.family_limits import (
    DEADLINE,
    DESCENDANTS,
    ENGINE_LIVE,
    FAMILY_LIVE,
    TOKEN_BUDGET,
    FamilyLedger,
    family_limits,
)


def ledger(per_request=None, **server) -> FamilyLedger:
    args = dict(max_tokens=100, max_children_per_request=4, token_factor=None,
                max_descendants=10, max_live_children=3, per_request=per_request or {})
    args.update(server)
    return FamilyLedger("root", family_limits(**args), started=1000.0)


def test_default_budget_is_one_plus_fan_out_times_max_tokens():
    fam = ledger()
    assert fam.limits.token_budget == 5 * 100
    # The request's own max_tokens is reserved for it.
    assert fam.tokens_left() == 400


def test_flag_raises_and_request_lowers_the_budget():
    assert ledger(token_factor=50).limits.token_budget == 5000
    assert ledger(per_request={"max_family_tokens": 150}).limits.token_budget == 150
    # A request cannot raise it above the server's.
    assert ledger(per_request={"max_family_tokens": 10**9}).limits.token_budget == 500
    # A budget below the request's max_tokens leaves nothing to descendants.
    fam = ledger(per_request={"max_family_tokens": 60})
    assert fam.tokens_left() == 0
    assert fam.spawn_refusal(0, 100) == TOKEN_BUDGET


def test_charging_trims_to_the_budget_and_marks_it_spent():
    fam = ledger(per_request={"max_family_tokens": 130})
    assert fam.tokens_left() == 30
    assert fam.allowed(25) == 25
    assert fam.charge(25) is False
    assert fam.allowed(10) == 5
    assert fam.charge(5) is True
    assert fam.exhausted_by == TOKEN_BUDGET
    assert fam.allowed(3) == 0
    assert fam.charge(0) is False  # reported once
    assert fam.child_budget(50) == 1


def test_spawn_refusals_in_order():
    fam = ledger(max_descendants=2)
    assert fam.spawn_refusal(0, 100) is None
    fam.spawned()
    fam.spawned()
    assert fam.spawn_refusal(0, 100) == DESCENDANTS
    fam = ledger()
    for _ in range(3):
        fam.spawned()
    assert fam.spawn_refusal(0, 100) == FAMILY_LIVE
    fam.child_ended()
    assert fam.spawn_refusal(0, 100) is None
    assert fam.spawn_refusal(100, 100) == ENGINE_LIVE
    # Asking changes nothing.
    assert fam.descendants == 3 and fam.live_children == 2 and fam.ignored == {}


def test_deadlines():
    fam = ledger(timeout_s=2.0, child_timeout_s=0.5,
                 per_request={"family_timeout_s": 1.5, "child_timeout_s": 9.0})
    assert fam.deadline == 1001.5
    assert fam.child_deadline(1000.2) == pytest.approx(1000.7)
    assert fam.expire(1001.0) is False
    assert fam.expire(1001.5) is True
    assert fam.exhausted_by == DEADLINE
    assert fam.expire(1002.0) is False  # once
    assert fam.spawn_refusal(0, 100) == DEADLINE
    assert ledger().deadline is None and ledger().child_deadline(5.0) is None


@pytest.mark.parametrize("key,value", [
    ("seqhooks_max_family_tokens", 0),
    ("seqhooks_max_family_tokens", -5),
    ("seqhooks_max_family_tokens", "100"),
    ("seqhooks_max_family_tokens", 1.5),
    ("seqhooks_max_family_tokens", True),
    ("seqhooks_max_family_tokens", [100]),
    ("seqhooks_max_family_tokens", {"a": 1}),
    ("seqhooks_max_descendants", -1),
    ("seqhooks_child_timeout_s", 0),
    ("seqhooks_child_timeout_s", -1.0),
    ("seqhooks_child_timeout_s", math.nan),
    ("seqhooks_child_timeout_s", math.inf),
    ("seqhooks_family_timeout_s", "soon"),
    ("seqhooks_family_timeout_s", [1.0]),
    ("seqhooks_family_timeout_s", None),
])
def test_bad_request_values_name_the_key(key, value):
    with pytest.raises(SpecialKwargsError, match=key):
        parse_request_overrides({key: value})


def test_request_values_parsed():
    got = parse_request_overrides({
        "seqhooks_max_family_tokens": 10**30, "seqhooks_max_descendants": 0,
        "seqhooks_child_timeout_s": 2, "seqhooks_family_timeout_s": 0.25,
    })
    assert got == {"max_family_tokens": 10**30, "max_descendants": 0,
                   "child_timeout_s": 2.0, "family_timeout_s": 0.25}


@pytest.mark.parametrize("field,value", [
    ("family_token_factor", 0), ("max_descendants", -1),
    ("max_live_children_per_family", 0), ("max_live_children", 0),
    ("child_timeout_s", 0), ("family_timeout_s", math.nan), ("fair_share", "yes"),
])
def test_bad_server_settings(field, value):
    with pytest.raises(SpecialKwargsError, match=field):
        SpecialKwargs(sync_token_id=1, promise_token_id=2, **{field: value})


def test_usage_adds_up_what_the_family_cost():
    root = HookNode("r", sampled_tokens=40,
                    joins=[JoinRecord(0.0, ["c0", "c1"], 9, prefilled_tokens=10)])
    c0 = HookNode("c0", parent_id="r", prompt_tokens=30, cached_prompt_tokens=16,
                  sampled_tokens=7)
    c1 = HookNode("c1", parent_id="r", prompt_tokens=32, cached_prompt_tokens=None,
                  sampled_tokens=5, joins=[JoinRecord(0.0, ["g"], 3, prefilled_tokens=4)])
    g = HookNode("g", parent_id="c1", prompt_tokens=35, cached_prompt_tokens=32,
                 sampled_tokens=3)
    usage = family_usage([root, c0, c1, g])
    assert usage["children_sampled_tokens"] == 15
    assert usage["family_sampled_tokens"] == 55
    assert usage["children_prefilled_tokens"] == (30 - 16) + 32 + 4 + (35 - 32)
    assert usage["join_prefill_tokens"] == 10
    assert usage["family_prefilled_tokens"] == 10 + 53


# ------------------------------------------------------------- fair share
def bomb_running(n, family="bomb", priority=0, blocks=2):
    return [Entry(f"{family}-c{i}", family, priority, True, blocks) for i in range(n)]


def test_one_family_alone_is_not_limited():
    waiting = [Entry(f"bomb-w{i}", "bomb", 0, True) for i in range(5)]
    got = plan(waiting, bomb_running(16), max_running=16, total_blocks=100)
    assert got.hold == [] and got.preempt == []


def test_plain_request_beside_a_full_family_gets_a_slot_now():
    waiting = [Entry(f"bomb-w{i}", "bomb", 0, True) for i in range(5)]
    waiting.append(Entry("plain", "plain", 0, False))
    got = plan(waiting, bomb_running(16), max_running=16, total_blocks=100)
    assert got.share == 8
    assert got.hold == [f"bomb-w{i}" for i in range(5)]
    # The newest child of the family over its share makes room.
    assert got.preempt == ["bomb-c15"]


def test_preemption_only_for_requests_that_came_after_the_family_forked():
    """A batch given at once (GRPO groups): the request that was already
    waiting when the family forked gets the slots the holds free, without
    preemption; a request that came later still gets one now."""
    waiting = [Entry("bomb-w0", "bomb", 0, True), Entry("early", "early", 0, False, arrival=3)]
    got = plan(waiting, bomb_running(16), max_running=16, total_blocks=100,
               forked_after={"bomb": 5})
    assert got.hold == ["bomb-w0"] and got.preempt == []
    late = [Entry("bomb-w0", "bomb", 0, True), Entry("late", "late", 0, False, arrival=5)]
    got = plan(late, bomb_running(16), max_running=16, total_blocks=100,
               forked_after={"bomb": 5})
    assert got.hold == ["bomb-w0"] and got.preempt == ["bomb-c15"]
    # a late request behind early ones still gets its slot
    both = [Entry("early", "early", 0, False, arrival=3), Entry("late", "late", 0, False,
                                                                 arrival=9)]
    got = plan(both, bomb_running(16), max_running=16, total_blocks=100,
               forked_after={"bomb": 5})
    assert got.preempt == ["bomb-c15"]
    # only a family that already held its children when it came gives way
    running = bomb_running(8, "a") + bomb_running(8, "b")
    got = plan([Entry("mid", "mid", 0, False, arrival=4)], running, max_running=16,
               total_blocks=100, forked_after={"a": 2, "b": 6})
    assert got.preempt == ["a-c7"]


def test_free_slot_means_no_preemption_and_under_share_children_pass():
    waiting = [Entry("bomb-w0", "bomb", 0, True), Entry("plain", "plain", 0, False)]
    got = plan(waiting, bomb_running(3), max_running=16, total_blocks=100)
    assert got.hold == [] and got.preempt == []


def test_blocks_count_toward_the_share():
    waiting = [Entry("bomb-w0", "bomb", 0, True), Entry("plain", "plain", 0, False)]
    # Two running children (under the slot share) hold 90 of 100 blocks.
    running = bomb_running(2, blocks=45)
    got = plan(waiting, running, max_running=16, total_blocks=100)
    assert got.hold == ["bomb-w0"]
    # A free slot: nothing is preempted for blocks.
    assert got.preempt == []
    # Parked parents' blocks count too; a family always keeps one running.
    got = plan(waiting, bomb_running(1, blocks=10), max_running=16, total_blocks=100,
               parked=[Entry("bomb", "bomb", 0, False, 80)])
    assert got.hold == ["bomb-w0"] and got.preempt == []


def test_priorities_are_respected_between_families():
    urgent_family = bomb_running(16, priority=0)
    waiting = [Entry("bomb-w0", "bomb", 0, True), Entry("plain", "plain", 5, False)]
    got = plan(waiting, urgent_family, max_running=16, total_blocks=100)
    assert got.hold == [] and got.preempt == []
    lax_family = bomb_running(16, priority=5)
    waiting = [Entry("bomb-w0", "bomb", 5, True), Entry("plain", "plain", 0, False)]
    got = plan(waiting, lax_family, max_running=16, total_blocks=100)
    assert got.hold == ["bomb-w0"] and got.preempt == ["bomb-c15"]


def test_two_families_split_the_slots():
    running = bomb_running(10, "a") + bomb_running(2, "b")
    waiting = [Entry("a-w", "a", 0, True), Entry("b-w", "b", 0, True),
               Entry("plain", "plain", 0, False)]
    got = plan(waiting, running, max_running=12, total_blocks=1000)
    assert got.share == 4
    assert got.hold == ["a-w"]
    # b is under its share: its child is not held back.
    assert got.preempt == ["a-c9"]


def test_blocks_hold_a_family_back_only_for_a_request_a_share_could_hold():
    """Under KV pressure a fair share of blocks can be smaller than what a
    waiting request needs to start (here 100 // 2 = 50 blocks against 55):
    holding a family back for it would only leave the blocks idle."""
    running = bomb_running(2, blocks=30)
    big = [Entry("bomb-w0", "bomb", 0, True), Entry("new", "new", 0, False, 55)]
    got = plan(big, running, max_running=16, total_blocks=100)
    assert got.hold == [] and got.preempt == []
    small = [Entry("bomb-w0", "bomb", 0, True), Entry("plain", "plain", 0, False, 2)]
    got = plan(small, running, max_running=16, total_blocks=100)
    assert got.hold == ["bomb-w0"]
    # Slots still count for any waiting request, whatever it needs.
    got = plan(big, bomb_running(16, blocks=1), max_running=16, total_blocks=100)
    assert got.hold == ["bomb-w0"] and got.preempt == ["bomb-c15"]


