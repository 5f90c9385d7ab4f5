"""Hooks cost what changed: which requests get hook work in a step.

Counted, not timed (issue 20): the hook scheduler's per-request path
(``Sampling.after_append``: charge, scan, apply, after vLLM appended the
step's tokens) runs only for requests that have hook work in that step; a step in which no request has any is served
by vLLM's own ``_update_request_with_output`` for every request.
"""

from __future__ import annotations

import pytest

from tests.support.sched_harness import (
    EOS_ID as EOS,
    PROMISE_END_ID as E,
    PROMISE_ID as P,
    SEP_ID as SEP,
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
    inner = sched.sampling.after_append
    # (the harness's call: the scheduler binds its own update_from_output
    # on itself while plain)
    orig_update = h._update

    def update(*args, **kwargs):
        steps.append([])
        return orig_update(*args, **kwargs)

    def watched(st, *args):
        steps[-1].append(st.request.request_id)
        return inner(st, *args)

    sched.sampling.after_append = watched
    h._update = update
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
def test_open_payloads_and_open_children_cost_only_their_hook_tokens(async_sched):
    """A request writing a promise's payload, or running beside its open
    children, gets the hook path only in the steps that sample a hook token
    or stop (a stop parks it, or closes its payload and spawns): not once a
    step for as long as a payload or a child is open."""
    h = SchedHarness(async_sched)
    h.add("f", prompt(12), max_tokens=27,
          script=[40, P] + [41] * 8 + [E] + [43] * 8 + [P] + [44] * 7)
    h.scripts[child_id("f", 0)] = [60] * 30 + [EOS]
    h.scripts[child_id("f", 1)] = [70, EOS]
    steps = _count_hook_work(h)
    h.run(max_steps=120)
    parent_steps = sum(step.count("f") for step in steps)
    # <promise>, </promise>, <promise>, and the stop inside the second
    # payload (max_tokens): it closes the payload, spawns, and parks.
    assert parent_steps == 4, [i for i, step in enumerate(steps) if "f" in step]
    trace = h.trace("f")
    assert [c["payload_token_ids"] for c in trace["children"]] == [[41] * 8, [44] * 7]
    assert h.tokens["f"][:27] == [40, P] + [41] * 8 + [E] + [43] * 8 + [P] + [44] * 7
    # (child 0's budget: what the parent had left when it spawned it)
    assert h.tokens["f"][27:] == [60] * 16 + [SEP, 70]
    assert h.finish_reasons["f"] is not None


@MODES
def test_schedule_is_vllms_own_while_no_fork_join_is_in_flight(async_sched, monkeypatch):
    """The hook scheduler's own schedule() runs only while a family has
    fork/join work in flight or pending (from the step after its fork to the
    step that counts its join's prefill); before the fork and after the
    join, vLLM's own schedule() serves every step (the harness checks at
    every step that no such work is pending then)."""
    h = SchedHarness(async_sched)
    for i in range(2):
        h.add(f"r{i}", prompt(12, 10 + i), max_tokens=40)
    h.add("f", prompt(12), max_tokens=16, script=[40] * 6 + [P, 41, E, 42, S] + [43] * 20)
    h.scripts[child_id("f", 0)] = [60, 61, 62, EOS]
    cls = type(h.sched)
    with_hooks = cls.schedule
    steps: list[bool] = []
    ours = [False]

    def counted(self, *args, **kwargs):
        ours[0] = True
        return with_hooks(self, *args, **kwargs)

    def note(harness, out):
        steps.append(ours[0])
        ours[0] = False

    # (ours is the class's; vLLM's own, while plain, is bound on the instance)
    monkeypatch.setattr(cls, "schedule", counted)
    h.after_schedule.append(note)
    h.run(max_steps=120)
    assert all(h.finish_reasons[rid] is not None for rid in ("r0", "r1", "f"))
    first, last = steps.index(True), len(steps) - 1 - steps[::-1].index(True)
    assert first >= 7  # the prefill and six plain tokens: vLLM's own
    assert all(steps[first:last + 1])  # one stretch, the family's
    assert last < len(steps) - 20  # then vLLM's own to the end
    assert h.tokens["f"][:11] == [40] * 6 + [P, 41, E, 42, S]


@MODES
def test_steps_with_only_children_running_are_vllms_own(async_sched, monkeypatch):
    """While its parents are parked, a step whose children sample no hook
    token is served by vLLM's own per-request update for every request: a
    parked parent's stop cannot happen (it does not run)."""
    h = SchedHarness(async_sched)
    for f in ("f", "g"):
        h.add(f, prompt(12), max_tokens=40, script=[40, P, 41, E, P, 42, E, S, 43, EOS])
        for k in range(2):
            h.scripts[child_id(f, k)] = [60 + k] * 12 + [EOS]
    cls = type(h.sched)
    per_request = cls._update_request_with_output
    hooked = []

    def counted(self, request, *args, **kwargs):
        hooked[-1].add(request.request_id)
        return per_request(self, request, *args, **kwargs)

    monkeypatch.setattr(cls, "_update_request_with_output", counted)
    parked_steps = []
    orig_update = h._update  # (the scheduler binds its own while plain)

    def update(*args, **kwargs):
        hooked.append(set())
        parked = h.sched.fork_join.num_parked
        out = orig_update(*args, **kwargs)
        if parked == 2 and h.sched.fork_join.num_parked == 2:
            parked_steps.append(len(hooked) - 1)
        return out

    h._update = update
    h.run(max_steps=120)
    assert len(parked_steps) >= 8  # both parents parked, children writing
    assert [hooked[i] for i in parked_steps] == [set()] * len(parked_steps)
    assert h.tokens["f"] == [40, P, 41, E, P, 42, E, S, *[60] * 12, SEP, *[61] * 12, 43, EOS]


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


def test_a_child_hashes_only_the_blocks_it_does_not_share_with_its_parent(monkeypatch):
    """A child's prompt starts with its parent's context: it takes the
    parent's block hashes for those whole blocks and hashes only the rest
    (a client loop's request is hashed whole), and its hashes are exactly
    the ones vLLM computes for the same prompt from scratch."""
    import vllm.v1.core.kv_cache_utils as kv_utils

    from tests.support.sched_setup import block_hasher

    hashed: list[int] = []
    real_hash = kv_utils.hash_block_tokens
    monkeypatch.setattr(kv_utils, "hash_block_tokens",
                        lambda fn, prev, tokens, extra=None: (
                            hashed.append(len(tokens)), real_hash(fn, prev, tokens, extra))[1])
    h = SchedHarness(False, num_blocks=200, block_size=4)
    parent = h.add("p", prompt(40), script=[20] * 9 + [P, 41, 42, E, S, EOS], max_tokens=30)
    h.scripts[child_id("p", 0)] = [60, 61, EOS]
    spawned = []
    orig = h.sched.spawning._start_child

    def start_child(st, child_id_, *args, **kwargs):
        hashed.clear()
        parent_hashes = len(st.request.block_hashes)
        orig(st, child_id_, *args, **kwargs)
        spawned.append((h.sched.fork_join.children[child_id_], parent_hashes, list(hashed)))

    monkeypatch.setattr(h.sched.spawning, "_start_child", start_child)
    h.run(max_steps=60)
    (child, parent_hashes, blocks_hashed), = spawned
    full = len(child.prompt_token_ids) // 4
    shared = min(parent_hashes, full)
    assert shared >= 10  # the parent's 40-token prompt and more
    assert len(blocks_hashed) == full - shared < full
    from vllm.v1.request import Request

    fresh = Request(request_id="fresh", prompt_token_ids=list(child.prompt_token_ids),
                    sampling_params=child.sampling_params, pooling_params=None,
                    arrival_time=0.0, block_hasher=block_hasher(4))
    assert len(fresh.block_hashes) == full
    assert child.block_hashes[:full] == fresh.block_hashes  # (then its own output's)
    assert parent.block_hashes[:shared] == child.block_hashes[:shared]


def test_fair_share_builds_its_plan_only_while_a_request_waits_beside_children():
    """Fair share holds back or preempts only children, and only for a
    request that is not one: its per-request entries are built only in
    steps where both exist (a plain request waiting beside running
    children), not in every step that children live; and a waiting
    request's entry is built once while it waits, not once a step."""
    h = SchedHarness(False, num_blocks=400, max_num_seqs=3)
    built: list[tuple[str, int]] = []
    entry = h.sched.fair_share._waiting_entry
    h.sched.fair_share._waiting_entry = lambda req: (
        built.append((req.request_id, len(h.sched.fork_join.children))), entry(req))[1]
    script = [20, P, 41, E, P, 42, E, P, 43, E, P, 44, E, S, 50, EOS]
    h.add("fam", prompt(12), script=script, max_tokens=40)
    for c in range(4):
        h.scripts[child_id("fam", c)] = [60] * 12 + [EOS]
    h.run_until(lambda: len(h.sched.fork_join.children) == 4)
    for _ in range(3):
        h.step()
        assert h.sched.waiting  # a child waits for a slot
    assert built == []  # children run or wait, nothing else waits: no plan
    for i in range(6):  # more plain requests than free slots: they wait
        h.add(f"plain{i}", prompt(12, 30 + i), script=[70] * 4 + [EOS], max_tokens=10)
    h.step()
    assert built and all(n > 0 for _, n in built)
    steps = 1
    while h.sched.waiting and any(r.request_id.startswith("plain") for r in h.sched.waiting):
        h.step()
        steps += 1
    assert steps > 3  # (several steps with plain requests waiting)
    # Built once per request while it waits (children built again only
    # after they ran: a preempted child waits with other tokens).
    for i in range(6):
        assert sum(rid == f"plain{i}" for rid, _ in built) == 1
    h.run(max_steps=200)
    for i in range(6):
        assert any(o.finish_reason is not None for o in h.outputs_for(f"plain{i}"))


@pytest.mark.parametrize("child_prompt", [
    list(range(10, 50)) + [7, 8],  # the parent's 40 tokens, then its own
    [99] + list(range(11, 50)),  # differs in the first block: nothing shared
    list(range(10, 18)),  # shorter than the parent's hashed blocks
])
def test_shared_block_hashes_equal_vllms_own(child_prompt):
    """Whatever a child's prompt shares with its parent, its block hashes
    are the ones vLLM computes for that prompt from scratch; without a
    hasher (prefix caching off) it has none, as vLLM would give it."""
    from vllm import SamplingParams
    from vllm.v1.request import Request

    from vllm_seqhooks.core.join_plan import common_prefix
    from vllm_seqhooks.engine.vllm_private import share_block_hashes
    from tests.support.sched_setup import block_hasher

    def request(rid, tokens, hasher):
        return Request(request_id=rid, prompt_token_ids=list(tokens),
                       sampling_params=SamplingParams(max_tokens=4), pooling_params=None,
                       arrival_time=0.0, block_hasher=hasher)

    parent = request("p", range(10, 50), block_hasher(4))
    assert len(parent.block_hashes) == 10
    shared = common_prefix(child_prompt, list(range(10, 50)))  # (the spawn knows it)
    child = request("c", child_prompt, None)
    share_block_hashes(child, parent, 4, shared)
    assert child.block_hashes == request("fresh", child_prompt, block_hasher(4)).block_hashes
    unhashed_parent = request("q", range(10, 50), None)
    child = request("d", child_prompt, None)
    share_block_hashes(child, unhashed_parent, 4, shared)
    assert child.block_hashes == [] and child._block_hasher is None


@pytest.mark.parametrize("shared", [36, 37, 38, 40])
def test_shared_block_hashes_with_lookahead_equal_vllms_own(shared):
    """With look-ahead block hashes (vLLM 0.33, EAGLE with prefix caching:
    a block's hash also covers the tokens after it), a child shares a
    block's hash only when it shares those tokens too."""
    import inspect

    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher
    from vllm.v1.request import Request

    from vllm_seqhooks.engine.vllm_private import share_block_hashes
    from tests.support.sched_setup import block_hasher

    if "num_hash_lookahead_tokens" not in inspect.signature(get_request_block_hasher).parameters:
        pytest.skip("this vLLM release hashes no look-ahead tokens")
    block_hasher(4)  # (vLLM's hash seed initialized)
    lookahead = get_request_block_hasher(4, sha256, num_hash_lookahead_tokens=2)

    def request(rid, tokens, hasher):
        return Request(request_id=rid, prompt_token_ids=list(tokens),
                       sampling_params=SamplingParams(max_tokens=4), pooling_params=None,
                       arrival_time=0.0, block_hasher=hasher)

    parent = request("p", range(10, 50), lookahead)
    child_prompt = list(range(10, 10 + shared)) + [7, 8, 9, 6, 5]
    child = request("c", child_prompt, None)
    share_block_hashes(child, parent, 4, shared, lookahead=2)
    assert child.block_hashes == request("fresh", child_prompt, lookahead).block_hashes
    if shared // 4 > (shared - 2) // 4 and len(parent.block_hashes) > (shared - 2) // 4:
        # (a parent block ends within the 2 tokens before the fork)
        wrong = request("w", child_prompt, None)
        share_block_hashes(wrong, parent, 4, shared)  # (as if there were no look-ahead)
        assert wrong.block_hashes != child.block_hashes


def test_request_hooks_are_reused_per_settings_and_bounded():
    """A request's hooks are worked out once per (depth, per-request
    settings) and reused (a family's children ask with the same ones); the
    kept ones stay bounded however many distinct settings clients send, and
    every request still gets its own."""
    h = SchedHarness(False, num_blocks=400, max_num_seqs=4)
    admission = h.sched.admission
    for i in range(300):
        h.add(f"r{i}", prompt(4, 10 + i % 40), max_tokens=2,
              extra_args={"seqhooks_child_max_tokens": 1 + i})
    states = h.sched.fork_join.states
    assert all(states[f"r{i}"].child_max_tokens == 1 + i for i in range(300))
    assert 0 < len(admission._hooks) <= 256
    before = dict(admission._hooks)
    h.add("again", prompt(4), max_tokens=2, extra_args={"seqhooks_child_max_tokens": 300})
    assert states["again"].child_max_tokens == 300
    assert admission._hooks == before  # (the same settings: reused)


def test_family_limits_are_reused_per_settings_and_bounded():
    """A family's limits are worked out once per (max_tokens, per-request
    settings) and reused; the kept ones stay bounded, and every family
    still gets its own."""
    h = SchedHarness(False, num_blocks=400, max_num_seqs=4)
    for i in range(300):
        capped = {"seqhooks_max_family_tokens": 5 + i % 7} if i % 2 else {}
        h.add(f"r{i}", prompt(4, 10 + i % 40), max_tokens=20 + i % 280, extra_args=capped)
    families = h.sched.fork_join.families
    for i in range(300):
        limits = families[f"r{i}"].limits
        if i % 2:
            assert limits.token_budget == limits.root_max_tokens == 5 + i % 7
        else:
            assert limits.root_max_tokens == 20 + i % 280 < limits.token_budget
    assert 0 < len(h.sched.family_limits._kept_limits) <= 256
