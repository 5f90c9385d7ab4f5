"""Surgical tests of the fork/join scheduler: no model, no worker.

The scheduler is built directly (``tests.support.sched_harness``) and
fed hand-built ``ModelRunnerOutput`` s whose tokens come from per-request
scripts; its state is checked after each step.  Every test runs on both
variants: ``SeqHooksSyncScheduler`` (EngineCore.step order) and
``SeqHooksAsyncScheduler`` (EngineCore.step_with_batch_queue order: step N+1
is scheduled before the output of step N is processed, with output
placeholders).
"""

from __future__ import annotations

import pytest

from tests.support.sched_harness import (
    EOS_ID as EOS,
    FAILED_MARKER_IDS,
    PROMISE_END_ID as E,
    PROMISE_ID as P,
    SEP_ID as SEP,
    SYNC_ID as S,
    SchedHarness,
    StallError,
    child_id,
)

from vllm.v1.engine import FinishReason
from vllm.v1.request import RequestStatus

MODES = pytest.mark.parametrize(
    "async_sched", [False, True], ids=["sync", "async"]
)

ZERO_STATE = {
    "nodes": 0,
    "hook_states": 0,
    "children": 0,
    "accounting": 0,
    "pending_outputs": 0,
    "parked": 0,
    "families": 0,
    "child_deadlines": 0,
    "stop_watch": 0,
    "deferred_children": 0,
    "arrival_order": 0,
    "requests": 0,
    "splice_held": 0,
    "splice_pending": 0,
    "splice_maps": 0,
    "logprob_rows": 0,
}


#: Speculative tokens per step the harness runs every test with (see
#: ``spec_tokens``): 0, and drafts accepted as the script goes.
SPEC_TOKENS = (0, 1, 4)

#: Tests whose assertions describe single steps (what is scheduled, or
#: when an abort lands, relative to one sampled token); with several tokens
#: a step their timing differs while the tokens stay the same.
STEP_EXACT = pytest.mark.one_token_per_step(
    "asserts per-step timing of one sampled token per step")
#: vLLM's own streaming-input sessions (hooks off): vLLM 0.32 does not roll
#: back num_computed_tokens for the drafts it cuts at a stop, so a session
#: stopped inside an accepted run resumes past its last token (upstream).
UPSTREAM_SESSIONS = pytest.mark.one_token_per_step(
    "vLLM's streaming sessions keep cut drafts in num_computed_tokens")


@pytest.fixture(autouse=True, params=SPEC_TOKENS, ids=[f"k{k}" for k in SPEC_TOKENS])
def spec_tokens(request, monkeypatch):
    """Every test runs with 0 speculative tokens and again with several
    (SchedHarness reads SEQHOOKS_HARNESS_SPEC_TOKENS): the fork/join tests
    assert the same tokens, merges and traces as with one token a step."""
    k = request.param
    marker = request.node.get_closest_marker("one_token_per_step")
    if k and marker is not None:
        pytest.skip(marker.args[0])
    monkeypatch.setenv("SEQHOOKS_HARNESS_SPEC_TOKENS", str(k))
    return k


def prompt(n: int, base: int = 30) -> list[int]:
    """``n`` plain prompt tokens (no hook token, no EOS)."""
    return [base + (i % 50) for i in range(n)]


def assert_clean(h: SchedHarness, initial_free: int) -> None:
    """Nothing left: requests, hook state, parked counters, KV blocks."""
    sched = h.sched
    assert not sched.requests, list(sched.requests)
    assert not sched.running and not sched.waiting and not sched.kv_holding_waiting
    assert sched.num_waiting_for_streaming_input == 0
    assert sched.hook_state_sizes() == ZERO_STATE
    assert h.free_blocks() == initial_free
    assert sched.kv_cache_manager.usage == 0
    assert not h.outputs_after_finish, h.outputs_after_finish


def no_child_outputs(h: SchedHarness) -> None:
    leaked = sorted(r for r in h.all_output_ids() if "@seqhooks-child" in r)
    assert not leaked, f"children's outputs left EngineCore: {leaked}"


def outputs_since(h: SchedHarness, start: int) -> list:
    return [o for step in h.output_log[start:] for o in step]


# ---------------------------------------------------------------------------
# 1. Spawn
# ---------------------------------------------------------------------------
@MODES
@pytest.mark.parametrize("child_max_tokens", [None, 7])
def test_spawn_forks_child_with_parent_prefix(async_sched, child_max_tokens):
    hooks = {} if child_max_tokens is None else {"child_max_tokens": child_max_tokens}
    h = SchedHarness(async_sched, block_size=16, hooks=hooks)
    initial_free = h.free_blocks()
    pr = prompt(20)
    parent_script = [40, P, 41, 42, E, 43, 44, 45, 46, 47, S, 48, EOS]
    parent = h.add(
        "r", pr, max_tokens=20, script=parent_script, stop_token_ids=[99], seed=1234,
        client_index=2,
    )
    caller_sp = parent.sampling_params
    parent_sp_before = (
        parent.sampling_params.max_tokens,
        parent.sampling_params.n,
        dict(parent.sampling_params.extra_args or {}),
        parent.sampling_params.seed,
    )
    caller_prompt = parent.prompt_token_ids
    caller_prompt_copy = list(caller_prompt)
    cid = child_id("r", 0)
    h.scripts[cid] = [60, 61, 62, EOS]

    seen = {}

    def on_update(hh, outs):
        if "child" in seen:
            return
        for o in outs:
            if o.request_id == "r" and E in o.new_token_ids:
                # The child is spawned while </promise> is processed.
                assert cid in hh.sched.requests
                child = hh.sched.requests[cid]
                seen["child"] = child
                seen["parent_status"] = hh.sched.requests["r"].status
                seen["parent_running"] = hh.sched.requests["r"] in hh.sched.running
                seen["n_sched"] = len(hh.schedules)

    h.after_update.append(on_update)
    h.run(max_steps=80)

    child = seen["child"]
    # fork: the parent's context through </promise>.
    assert child.prompt_token_ids == pr + [40, P, 41, 42, E]
    sp = child.sampling_params
    assert sp.n == 1
    expected_budget = child_max_tokens if child_max_tokens is not None else 20 - 5
    assert sp.max_tokens == expected_budget
    assert child.max_tokens == expected_budget
    assert sp.extra_args["seqhooks_child_key"] == "0"
    # Inherited sampling settings.
    assert sp.temperature == caller_sp.temperature
    assert sp.stop_token_ids == [99]
    assert sp.eos_token_id == EOS
    assert sp.seed is not None and sp.seed != 1234  # derived, not copied
    assert child.client_index == parent.client_index == 2
    assert child.priority == parent.priority
    assert child.cache_salt == parent.cache_salt
    # The parent keeps running after the spawn and is scheduled again.
    assert seen["parent_status"] == RequestStatus.RUNNING and seen["parent_running"]
    assert "r" in h.schedules[seen["n_sched"]]
    # The caller's objects are untouched.
    assert caller_prompt == caller_prompt_copy
    psp = caller_sp
    assert (psp.max_tokens, psp.n, dict(psp.extra_args or {}), psp.seed) == parent_sp_before
    # Children never show up in EngineCore outputs; the parent's (merged
    # tokens included) all go to its own client.
    no_child_outputs(h)
    assert h.output_clients["r"] == {2}
    # The child shares the parent's first full block through the prefix cache.
    trace = h.trace("r")
    assert trace["children"][0]["payload_token_ids"] == [41, 42]
    assert trace["children"][0]["prompt_tokens"] == 25
    assert trace["children"][0]["cached_prompt_tokens"] == 16
    assert h.scheduled_counts(cid)[0] == 25 - 16
    assert h.finish_reasons["r"] == FinishReason.STOP
    assert h.tokens["r"] == [40, P, 41, 42, E, 43, 44, 45, 46, 47, S, 60, 61, 62, 48, EOS]
    assert_clean(h, initial_free)


@MODES
def test_spawn_payload_context_and_promise_closed_by_promise(async_sched):
    """child_context="payload": the child's prompt is the payload alone; with
    no </promise> token a payload closes at the next <promise> / <sync>."""
    h = SchedHarness(
        async_sched, hooks={"child_context": "payload", "promise_end_token_id": None}
    )
    h.add("r", prompt(10), max_tokens=30, script=[P, 41, 42, P, 43, S, 44, EOS])
    c0, c1 = child_id("r", 0), child_id("r", 1)
    h.scripts[c0] = [60, EOS]
    h.scripts[c1] = [61, 62, EOS]
    prompts = {}

    def grab(hh, out):
        for cid in (c0, c1):
            if cid in hh.sched.requests and cid not in prompts:
                prompts[cid] = list(hh.sched.requests[cid].prompt_token_ids)

    h.after_schedule.append(grab)
    h.run(max_steps=60)
    assert prompts == {c0: [41, 42], c1: [43]}
    assert h.tokens["r"] == [P, 41, 42, P, 43, S, 60, SEP, 61, 62, 44, EOS]
    no_child_outputs(h)


@MODES
def test_payload_closed_by_end_of_generation(async_sched):
    """No </promise> token: a payload still open when the parent stops closes
    there (the EOS is not part of it); the parent then waits for the child."""
    h = SchedHarness(async_sched, hooks={"promise_end_token_id": None})
    initial_free = h.free_blocks()
    pr = prompt(10)
    h.add("r", pr, max_tokens=30, script=[40, P, 41, 42, EOS])
    cid = child_id("r", 0)
    h.scripts[cid] = [60, 61, EOS]
    prompts = {}
    h.after_schedule.append(
        lambda hh, out: prompts.setdefault(cid, list(hh.sched.requests[cid].prompt_token_ids))
        if cid in hh.sched.requests else None
    )
    h.run(max_steps=40)
    assert prompts[cid] == pr + [40, P, 41, 42]
    assert h.tokens["r"] == [40, P, 41, 42, 60, 61, EOS]
    assert h.finish_reasons["r"] == FinishReason.STOP
    assert h.trace("r")["children"][0]["payload_token_ids"] == [41, 42]
    assert_clean(h, initial_free)


@MODES
def test_payload_closed_by_sync(async_sched):
    """<sync> closes an open payload (spawning its child) and then waits for it."""
    h = SchedHarness(async_sched)
    pr = prompt(12)
    h.add("r", pr, max_tokens=30, script=[40, P, 41, 42, S, 43, EOS])
    cid = child_id("r", 0)
    h.scripts[cid] = [60, EOS]
    prompts = {}
    h.after_schedule.append(
        lambda hh, out: prompts.setdefault(cid, list(hh.sched.requests[cid].prompt_token_ids))
        if cid in hh.sched.requests else None
    )
    h.run(max_steps=40)
    assert prompts[cid] == pr + [40, P, 41, 42]
    assert h.tokens["r"] == [40, P, 41, 42, S, 60, 43, EOS]


# ---------------------------------------------------------------------------
# 2. Block
# ---------------------------------------------------------------------------
@STEP_EXACT
@MODES
def test_sync_parks_parent_with_kv_kept(async_sched):
    h = SchedHarness(async_sched, block_size=16)
    pr = prompt(20)
    h.add("r", pr, max_tokens=30, script=[40, P, 41, E, 42, S, 43, 44, EOS])
    cid = child_id("r", 0)
    h.scripts[cid] = [60 + i for i in range(8)] + [EOS]
    park = {}

    def on_update(hh, outs):
        for o in outs:
            if o.request_id == "r" and S in o.new_token_ids and "at" not in park:
                req = hh.sched.requests["r"]
                park["at"] = len(hh.schedules)
                park["out"] = (list(o.new_token_ids), o.finish_reason, o.stop_reason)
                park["status"] = req.status
                park["blocks"] = hh.blocks_of("r")
                park["child_running"] = hh.sched.requests[cid].status
                park["in_running"] = req in hh.sched.running
            elif o.request_id == "r" and "at" in park and "join" not in park:
                park["join"] = len(hh.schedules)

    h.after_update.append(on_update)
    h.run(max_steps=80)
    assert park["status"] == RequestStatus.WAITING_FOR_STREAMING_REQ
    assert not park["in_running"]
    assert park["blocks"], "a parked parent keeps its KV blocks"
    assert park["out"] == ([S], None, None)
    assert park["child_running"] == RequestStatus.RUNNING
    # Never scheduled between the park and the join.
    between = h.schedules[park["at"] : park["join"]]
    assert between and all("r" not in s for s in between)
    assert all(cid in s for s in between)
    assert h.tokens["r"] == [40, P, 41, E, 42, S, *range(60, 68), 43, 44, EOS]
    no_child_outputs(h)


@MODES
def test_parked_parents_do_not_starve_children_of_slots(async_sched):
    """max_num_seqs=2, two parents parked, their children waiting: the
    children must be admitted (parked parents do not hold slots)."""
    h = SchedHarness(async_sched, max_num_seqs=2, block_size=16, num_blocks=64)
    initial_free = h.free_blocks()
    for rid in ("a", "b"):
        h.add(rid, prompt(20, base=30 if rid == "a" else 31), max_tokens=20,
              script=[40, P, 41, E, S, 42, EOS])
        h.scripts[child_id(rid, 0)] = [60, 61, 62, EOS]
    both_parked = []

    def on_schedule(hh, out):
        statuses = [hh.sched.requests[r].status for r in ("a", "b") if r in hh.sched.requests]
        if statuses == [RequestStatus.WAITING_FOR_STREAMING_REQ] * 2:
            both_parked.append(dict(out.num_scheduled_tokens))

    h.after_schedule.append(on_schedule)
    h.run(max_steps=60)
    assert both_parked, "expected a step where both parents are parked"
    assert any(
        child_id("a", 0) in s and child_id("b", 0) in s for s in both_parked
    ), f"children not admitted while both parents parked: {both_parked}"
    for rid in ("a", "b"):
        assert h.tokens[rid] == [40, P, 41, E, S, 60, 61, 62, 42, EOS]
        assert h.finish_reasons[rid] == FinishReason.STOP
    no_child_outputs(h)
    assert_clean(h, initial_free)


@MODES
def test_single_slot_runs_children_one_by_one(async_sched):
    h = SchedHarness(async_sched, max_num_seqs=1)
    initial_free = h.free_blocks()
    h.add("r", prompt(16), max_tokens=40, script=[P, 41, E, P, 42, E, S, 43, EOS])
    h.scripts[child_id("r", 0)] = [60, 61, EOS]
    h.scripts[child_id("r", 1)] = [70, EOS]
    h.run(max_steps=60)
    assert all(len(s) <= 1 for s in h.schedules)
    assert h.tokens["r"] == [P, 41, E, P, 42, E, S, 60, 61, SEP, 70, 43, EOS]
    assert_clean(h, initial_free)


# ---------------------------------------------------------------------------
# 3. Join
# ---------------------------------------------------------------------------
@MODES
def test_join_prefills_only_sync_and_merged_tokens(async_sched):
    h = SchedHarness(async_sched, block_size=16)
    initial_free = h.free_blocks()
    L = 20
    h.add("r", prompt(L), max_tokens=30, script=[40, P, 41, E, 42, S, 43, 44, EOS])
    cid = child_id("r", 0)
    h.scripts[cid] = [60, 61, 62, EOS]
    merged = [60, 61, 62]
    sync_pos = L + 5  # tokens the parent had before <sync>
    info = {}

    def on_update(hh, outs):
        for o in outs:
            if o.request_id != "r":
                continue
            if o.new_token_ids[: len(merged)] == merged and "join" not in info:
                req = hh.sched.requests["r"]
                info["join"] = len(hh.schedules)
                info["out"] = (list(o.new_token_ids), o.finish_reason)
                info["status"] = req.status
                info["computed"] = req.num_computed_tokens
                info["num_tokens"] = req.num_tokens
                info["queued"] = req in hh.sched.kv_holding_waiting or req in hh.sched.waiting

    h.after_update.append(on_update)
    h.run(max_steps=80)
    assert info["out"] == (merged, None)
    assert info["status"] in (RequestStatus.WAITING, RequestStatus.RUNNING)
    assert info["queued"]
    assert info["computed"] == sync_pos
    assert info["num_tokens"] == sync_pos + 1 + len(merged)
    # The first schedule of the parent after the join: <sync> + merged only.
    nxt = next(i for i in range(info["join"], len(h.schedules)) if "r" in h.schedules[i])
    assert h.schedules[nxt]["r"] == len(merged) + 1
    assert h.computed_before[nxt]["r"] == sync_pos
    # ... then plain decoding to the end.
    assert h.tokens["r"] == [40, P, 41, E, 42, S, *merged, 43, 44, EOS]
    assert h.finish_reasons["r"] == FinishReason.STOP
    trace = h.trace("r")
    assert len(trace["joins"]) == 1
    j = trace["joins"][0]
    assert j["prefilled_tokens"] == len(merged) + 1
    assert j["reused_tokens"] == sync_pos
    assert j["merged_tokens"] == len(merged)
    assert j["children"] == ["0"]
    assert trace["children"][0]["state"] == "merged"
    assert trace["children"][0]["output_token_ids"] == merged
    no_child_outputs(h)
    assert_clean(h, initial_free)


@MODES
def test_join_continuation_params(async_sched):
    """The continuation gets the remaining budget, the remaining min_tokens and
    the count of tokens sampled before (for the worker's scripted sampler);
    the caller's SamplingParams stay untouched."""
    h = SchedHarness(async_sched)
    req = h.add("r", prompt(20), max_tokens=30, min_tokens=10,
                script=[40, P, 41, E, 42, S, 43, 44, EOS])
    caller_sp = req.sampling_params
    h.scripts[child_id("r", 0)] = [60, 61, EOS]
    seen = {}

    def on_update(hh, outs):
        for o in outs:
            if o.request_id == "r" and 60 in o.new_token_ids and "sp" not in seen:
                r = hh.sched.requests["r"]
                seen["sp"] = r.sampling_params
                seen["max_tokens"] = r.max_tokens
                seen["stop_reason"] = r.stop_reason

    h.after_update.append(on_update)
    h.run(max_steps=60)
    sp = seen["sp"]
    assert sp is not caller_sp
    assert seen["max_tokens"] == sp.max_tokens == 30 - 6
    assert sp.min_tokens == 10 - 6
    assert sp.extra_args["seqhooks_sampled_before"] == 6
    assert seen["stop_reason"] is None
    assert (caller_sp.max_tokens, caller_sp.min_tokens, caller_sp.extra_args) == (30, 10, None)
    assert h.tokens["r"] == [40, P, 41, E, 42, S, 60, 61, 43, 44, EOS]


@MODES
def test_two_fork_join_rounds(async_sched):
    h = SchedHarness(async_sched)
    initial_free = h.free_blocks()
    L = 20
    h.add("r", prompt(L), max_tokens=14,
          script=[P, 41, E, S, 42, P, 43, E, S, 44, 45, 46, 47, 48, 49, 50])
    h.scripts[child_id("r", 0)] = [60, 61, EOS]
    h.scripts[child_id("r", 1)] = [70, 71, 72, EOS]
    h.run(max_steps=80)
    # 14 sampled tokens (max_tokens) + 5 merged ones.
    assert h.tokens["r"] == [P, 41, E, S, 60, 61, 42, P, 43, E, S, 70, 71, 72,
                             44, 45, 46, 47, 48]
    assert h.finish_reasons["r"] == FinishReason.LENGTH
    trace = h.trace("r")
    assert [j["children"] for j in trace["joins"]] == [["0"], ["1"]]
    assert [j["prefilled_tokens"] for j in trace["joins"]] == [3, 4]
    assert [j["reused_tokens"] for j in trace["joins"]] == [L + 3, L + 3 + 1 + 2 + 4]
    # The second child forks the context with the first merge in it.
    assert trace["children"][1]["prompt_tokens"] == L + 10
    assert_clean(h, initial_free)


@STEP_EXACT
@MODES
def test_join_prefill_chunked(async_sched):
    """A long merge is prefilled in chunks (max_num_batched_tokens=16); the
    trace counts every chunk."""
    h = SchedHarness(async_sched, max_num_batched_tokens=16, max_model_len=256)
    L = 40
    h.add("r", prompt(L), max_tokens=40, script=[40, P, 41, E, 42, S, 43, 44, EOS])
    merged = [60 + i for i in range(25)]
    h.scripts[child_id("r", 0)] = merged + [EOS]
    h.run(max_steps=120)
    assert h.tokens["r"] == [40, P, 41, E, 42, S, *merged, 43, 44, EOS]
    j = h.trace("r")["joins"][0]
    assert j["prefilled_tokens"] == len(merged) + 1
    assert j["reused_tokens"] == L + 5
    counts = h.scheduled_counts("r")
    assert [16, 10] == [c for c in counts if c > 1][-2:]


@MODES
def test_join_max_tokens_counts_only_sampled_tokens(async_sched):
    """Rule 3: merged tokens do not count against max_tokens (the budget is
    refreshed on the continuation)."""
    h = SchedHarness(async_sched)
    max_tokens = 9
    h.add("r", prompt(12), max_tokens=max_tokens, script=[40, P, 41, E, S, 42, 43, 44, 45, 46, 47])
    h.scripts[child_id("r", 0)] = [60, 61, 62, 63, EOS]
    h.run(max_steps=60)
    toks = h.tokens["r"]
    assert toks == [40, P, 41, E, S, 60, 61, 62, 63, 42, 43, 44, 45]
    assert len(toks) - 4 == max_tokens
    assert h.finish_reasons["r"] == FinishReason.LENGTH


@STEP_EXACT
@MODES
def test_join_immediately_when_children_already_done(async_sched):
    """Children that finished before <sync>: the park and the join happen in
    the same step (with async scheduling a stale step of the parent is in
    flight)."""
    h = SchedHarness(async_sched)
    initial_free = h.free_blocks()
    h.add("r", prompt(20), max_tokens=30,
          script=[40, P, 41, E, 42, 43, 44, 45, 46, 47, S, 48, EOS])
    h.scripts[child_id("r", 0)] = [60, EOS]
    h.run(max_steps=60)
    assert h.tokens["r"] == [40, P, 41, E, 42, 43, 44, 45, 46, 47, S, 60, 48, EOS]
    outs = h.outputs_for("r")
    sync_out = next(o for o in outs if S in o.new_token_ids)
    assert list(sync_out.new_token_ids) == [S, 60] and sync_out.finish_reason is None
    assert h.trace("r")["joins"][0]["prefilled_tokens"] == 2
    assert_clean(h, initial_free)


@MODES
@pytest.mark.parametrize("sep", [[SEP], [], [9, 10]], ids=["newline", "empty", "two"])
def test_merge_in_promise_order_with_separator(async_sched, sep):
    h = SchedHarness(async_sched, hooks={"merge_separator_token_ids": sep})
    h.add("r", prompt(16), max_tokens=40,
          script=[P, 41, E, P, 42, E, S, 43, EOS])
    c0, c1 = child_id("r", 0), child_id("r", 1)
    # child 0 ends after child 1.
    h.scripts[c0] = [60, 61, 62, 63, 64, EOS]
    h.scripts[c1] = [70, EOS]
    h.run(max_steps=60)
    assert h.tokens["r"] == [P, 41, E, P, 42, E, S, 60, 61, 62, 63, 64, *sep, 70, 43, EOS]
    trace = h.trace("r")
    assert [c["key"] for c in trace["children"]] == ["0", "1"]
    assert trace["joins"][0]["children"] == ["0", "1"]


@MODES
def test_merge_strategy_none_only_waits(async_sched):
    h = SchedHarness(async_sched, hooks={"merge_strategy": "none"})
    initial_free = h.free_blocks()
    h.add("r", prompt(16), max_tokens=40, script=[P, 41, E, S, 43, EOS])
    h.scripts[child_id("r", 0)] = [60, 61, 62, EOS]
    parked = []
    h.after_update.append(lambda hh, outs: parked.append(
        "r" in hh.sched.requests and hh.sched.requests["r"].status
        == RequestStatus.WAITING_FOR_STREAMING_REQ))
    h.run(max_steps=40)
    assert any(parked)  # it did wait for the child
    assert h.tokens["r"] == [P, 41, E, S, 43, EOS]
    j = h.trace("r")["joins"][0]
    assert j["merged_tokens"] == 0 and j["prefilled_tokens"] == 1
    assert_clean(h, initial_free)


# ---------------------------------------------------------------------------
# 4. <sync> with no open children
# ---------------------------------------------------------------------------
@STEP_EXACT
@MODES
def test_sync_without_children_is_noop(async_sched):
    h = SchedHarness(async_sched)
    initial_free = h.free_blocks()
    h.add("r", prompt(10), max_tokens=20, script=[40, S, 41, P, 42, E, S, 43, S, 44, EOS])
    h.scripts[child_id("r", 0)] = [60, 61, EOS]
    after_sync = []

    def on_update(hh, outs):
        for o in outs:
            if o.request_id == "r" and S in o.new_token_ids:
                after_sync.append((hh.sched.requests["r"].status, o.finish_reason))

    h.after_update.append(on_update)
    h.run(max_steps=60)
    # The first <sync> (no child yet) and the third (all joined) are text;
    # only the second (one open child) parks the parent.
    assert after_sync == [
        (RequestStatus.RUNNING, None),
        (RequestStatus.WAITING_FOR_STREAMING_REQ, None),
        (RequestStatus.RUNNING, None),
    ]
    assert h.tokens["r"] == [40, S, 41, P, 42, E, S, 60, 61, 43, S, 44, EOS]
    assert h.sched.hook_stats["joins"] == 1
    assert len(h.trace("r")["joins"]) == 1
    assert_clean(h, initial_free)


@STEP_EXACT
@MODES
def test_sync_without_children_keeps_decoding(async_sched):
    h = SchedHarness(async_sched)
    h.add("r", prompt(10), max_tokens=20, script=[40, S, 41, 42, EOS])
    parked = []
    h.after_schedule.append(
        lambda hh, out: parked.append(
            "r" in hh.sched.requests
            and hh.sched.requests["r"].status == RequestStatus.WAITING_FOR_STREAMING_REQ
        )
    )
    h.run(max_steps=30)
    assert h.tokens["r"] == [40, S, 41, 42, EOS]
    assert not any(parked)
    # Scheduled at every step until it finished (no gap after <sync>).
    counts = h.scheduled_counts("r")
    assert counts[0] == 10 and all(c == 1 for c in counts[1:])
    assert h.trace("r") is None  # no hook fired
    assert h.sched.hook_stats["joins"] == 0


# ---------------------------------------------------------------------------
# 5. Parent finishing with open children
# ---------------------------------------------------------------------------
@MODES
@pytest.mark.parametrize("how", ["eos", "max_tokens", "stop_token", "sync_is_last"])
def test_finished_parent_waits_for_children(async_sched, how):
    h = SchedHarness(async_sched, hooks={"child_max_tokens": 10})
    initial_free = h.free_blocks()
    cid = child_id("r", 0)
    child_out = [60, 61, 62, 63, 64]
    h.scripts[cid] = child_out + [EOS]
    if how == "eos":
        h.add("r", prompt(12), max_tokens=30, script=[40, P, 41, E, 42, EOS])
        own, held, reason, stop_reason = [40, P, 41, E, 42], [EOS], FinishReason.STOP, None
    elif how == "stop_token":
        h.add("r", prompt(12), max_tokens=30, script=[40, P, 41, E, 42, 77],
              stop_token_ids=[77])
        own, held, reason, stop_reason = [40, P, 41, E, 42], [77], FinishReason.STOP, 77
    elif how == "sync_is_last":
        # <sync> is also the last token the budget allows.
        h.add("r", prompt(12), max_tokens=6, script=[40, P, 41, E, 42, S])
        own, held, reason, stop_reason = [40, P, 41, E, 42, S], [], FinishReason.LENGTH, None
    else:
        h.add("r", prompt(12), max_tokens=6, script=[40, P, 41, E, 42, 43])
        own, held, reason, stop_reason = [40, P, 41, E, 42, 43], [], FinishReason.LENGTH, None
    waited = {}

    def on_update(hh, outs):
        r = [o for o in outs if o.request_id == "r"]
        if "r" in hh.sched.requests and cid in hh.sched.requests:
            req = hh.sched.requests["r"]
            if req.status == RequestStatus.WAITING_FOR_STREAMING_REQ:
                waited.setdefault("status", req.status)
        for o in r:
            if o.finish_reason is None and o.stop_reason is not None:
                waited["leaked_stop_reason"] = o.stop_reason

    h.after_update.append(on_update)
    h.run(max_steps=60)
    assert waited.get("status") == RequestStatus.WAITING_FOR_STREAMING_REQ
    assert "leaked_stop_reason" not in waited
    outs = h.outputs_for("r")
    finals = [o for o in outs if o.finish_reason is not None]
    assert len(finals) == 1 and finals[0] is outs[-1]
    assert finals[0].finish_reason == reason
    assert finals[0].stop_reason == stop_reason
    # Merged tokens come with the finish; a stop token is held until after them.
    assert list(finals[0].new_token_ids)[-len(child_out + held):] == child_out + held
    assert h.tokens["r"] == own + child_out + held
    trace = h.trace("r")
    assert trace["children"][0]["output_token_ids"] == child_out
    no_child_outputs(h)
    assert_clean(h, initial_free)


# ---------------------------------------------------------------------------
# 6. Abort
# ---------------------------------------------------------------------------
@STEP_EXACT
@MODES
@pytest.mark.parametrize("when", ["parked", "children_running", "child_waiting"])
def test_abort_parent_takes_down_subtree(async_sched, when):
    h = SchedHarness(async_sched, max_num_seqs=4)
    initial_free = h.free_blocks()
    h.add("other", prompt(18, base=35), max_tokens=40)
    h.add("r", prompt(20), max_tokens=40, script=[40, P, 41, E, P, 42, E, 43, S, 44, EOS])
    c0, c1 = child_id("r", 0), child_id("r", 1)
    h.scripts[c0] = [60 + i for i in range(30)]
    h.scripts[c1] = [70 + i for i in range(30)]
    if when == "parked":
        cond = lambda: ("r" in h.sched.requests and h.sched.requests["r"].status
                        == RequestStatus.WAITING_FOR_STREAMING_REQ)
    elif when == "children_running":
        cond = lambda: (c1 in h.sched.requests and h.sched.requests[c1].status
                        == RequestStatus.RUNNING and h.sched.requests["r"].status
                        == RequestStatus.RUNNING)
    else:
        cond = lambda: c1 in h.sched.requests
    h.run_until(cond, max_steps=40)
    mark = len(h.output_log)
    aborted = h.abort("r")
    assert {r.request_id for r in aborted} == {"r", c0, c1}
    assert not {"r", c0, c1} & set(h.sched.requests)
    h.run(max_steps=80)
    later = {o.request_id for o in outputs_since(h, mark)}
    assert not later & {"r", c0, c1}, later
    assert h.finish_reasons.get("other") == FinishReason.LENGTH
    assert "r" not in h.finish_reasons  # the frontend reports the abort itself
    no_child_outputs(h)
    assert_clean(h, initial_free)


@MODES
@pytest.mark.parametrize(
    "trigger,victim",
    [("r:sync", "r"), ("r:sync", "child"), ("child:eos", "child"),
     ("child:eos", "r"), ("r:promise_end", "r")],
)
@STEP_EXACT
def test_abort_between_execute_and_update(async_sched, trigger, victim):
    """EngineCore applies aborts that arrive while the model runs right before
    update_from_output: the step's output then carries tokens of requests that
    are gone (the parent's <sync>, the child's EOS, the </promise> that would
    spawn)."""
    h = SchedHarness(async_sched)
    initial_free = h.free_blocks()
    h.add("other", prompt(12, base=35), max_tokens=30)
    h.add("r", prompt(20), max_tokens=40, script=[40, P, 41, E, 42, S, 43, EOS])
    cid = child_id("r", 0)
    h.scripts[cid] = [60, 61, 62, 63, EOS]
    who, what = trigger.split(":")
    who = cid if who == "child" else "r"
    tok = {"sync": S, "eos": EOS, "promise_end": E}[what]
    victim_id = cid if victim == "child" else "r"
    fired = []
    execute = h.execute

    def execute_and_abort(out):
        mro = execute(out)
        i = mro.req_id_to_index.get(who)
        if not fired and i is not None and tok in mro.sampled_token_ids[i]:
            h.pending_aborts.append(victim_id)
            fired.append(len(h.output_log))
        return mro

    h.execute = execute_and_abort
    h.run(max_steps=100)
    assert fired
    assert h.finish_reasons["other"] == FinishReason.LENGTH
    if victim == "r":
        assert "r" not in h.finish_reasons
        assert not {o.request_id for o in outputs_since(h, fired[0])} & {"r", cid}
        assert h.sched.hook_stats["children_spawned"] == (0 if what == "promise_end" else 1)
    else:
        # The aborted child contributes nothing; the parent goes on.
        assert h.tokens["r"] == [40, P, 41, E, 42, S, 43, EOS]
        assert h.finish_reasons["r"] == FinishReason.STOP
        assert h.trace("r")["children"][0]["state"] == "aborted"
    no_child_outputs(h)
    assert_clean(h, initial_free)


@MODES
def test_abort_all(async_sched):
    h = SchedHarness(async_sched)
    initial_free = h.free_blocks()
    h.add("r", prompt(20), max_tokens=40, script=[40, P, 41, E, S, 44, EOS])
    h.scripts[child_id("r", 0)] = [60 + i for i in range(30)]
    h.run_until(lambda: h.sched.requests["r"].status
                == RequestStatus.WAITING_FOR_STREAMING_REQ, max_steps=30)
    assert h.sched.metrics.gauges["parked_requests"] == 1
    h.sched.finish_requests(None, RequestStatus.FINISHED_ABORTED)
    # Clean at once, without another step (what vLLM's pause with
    # mode="abort" does, after which the engine does not step until resumed),
    # and the gauges say so.
    assert_clean(h, initial_free)
    assert h.sched.metrics.gauges["parked_requests"] == 0
    assert h.sched.metrics.gauges["open_children"] == 0
    h.run(max_steps=20)
    assert_clean(h, initial_free)


@MODES
def test_reset_prefix_cache_with_families_in_flight(async_sched):
    """``reset_prefix_cache(reset_running_requests=True)`` (what vLLM's pause
    and a weight update ask for) succeeds with a parent parked on running
    children: vLLM preempts the children, the parent gives its blocks back
    (spilled); the family then finishes with the tokens it has without the
    reset and nothing is left. Without ``reset_running_requests`` the reset
    fails while blocks are held, as vLLM's does for running requests."""
    script = [40, P, 41, E, P, 42, E, S, 44, EOS]

    def family(reset: bool):
        h = SchedHarness(async_sched)
        initial_free = h.free_blocks()
        h.add("r", prompt(40), max_tokens=40, script=script)
        for k in range(2):
            h.scripts[child_id("r", k)] = [60 + 10 * k + i for i in range(12)] + [EOS]
        h.run_until(lambda: h.sched.requests["r"].status
                    == RequestStatus.WAITING_FOR_STREAMING_REQ, max_steps=40)
        if reset:
            assert h.sched.requests["r"].num_computed_tokens > 0
            assert h.sched.reset_prefix_cache() is False
            assert h.sched.reset_prefix_cache(reset_running_requests=True) is True
            assert h.sched.requests["r"].num_computed_tokens == 0
            assert h.sched.kv_cache_manager.usage == 0
            assert h.sched.hook_stats["spills"] == 1
        h.run(max_steps=200)
        assert h.finish_reasons["r"] == FinishReason.STOP
        assert_clean(h, initial_free)
        return h.tokens["r"]

    without = family(reset=False)
    assert without.count(S) == 1 and 60 in without and 70 in without
    assert family(reset=True) == without


# ---------------------------------------------------------------------------
# 7. A child that fails or is aborted
# ---------------------------------------------------------------------------
@STEP_EXACT
@MODES
@pytest.mark.parametrize("marker", [False, True], ids=["nothing", "marker"])
@pytest.mark.parametrize("parent_state", ["parked", "running"])
@pytest.mark.parametrize("status", ["aborted", "error"])
def test_aborted_child_does_not_block_parent(async_sched, marker, parent_state, status):
    hooks = {"failed_child_marker": "<failed>"} if marker else {}
    h = SchedHarness(async_sched, hooks=hooks)
    initial_free = h.free_blocks()
    script = [40, P, 41, E, 42, 43, 44, 45, S, 46, EOS]
    h.add("r", prompt(20), max_tokens=40, script=script)
    cid = child_id("r", 0)
    h.scripts[cid] = [60 + i for i in range(30)]
    if parent_state == "parked":
        h.run_until(lambda: h.sched.requests["r"].status
                    == RequestStatus.WAITING_FOR_STREAMING_REQ, max_steps=40)
    else:
        h.run_until(lambda: cid in h.sched.requests
                    and h.sched.requests[cid].num_computed_tokens > 0, max_steps=40)
        assert h.sched.requests["r"].status == RequestStatus.RUNNING
    if status == "aborted":
        aborted = h.abort(cid)
    else:
        aborted = h.sched.finish_requests([cid], RequestStatus.FINISHED_ERROR)
    assert [r.request_id for r in aborted] == [cid]
    # The parent is the only request left: the engine must keep stepping.
    steps = h.run(max_steps=40)
    assert steps <= 20
    filler = list(FAILED_MARKER_IDS) if marker else []
    assert h.tokens["r"] == [40, P, 41, E, 42, 43, 44, 45, S, *filler, 46, EOS]
    assert h.finish_reasons["r"] == FinishReason.STOP
    child = h.trace("r")["children"][0]
    assert child["state"] == {"aborted": "aborted", "error": "failed"}[status]
    assert child["output_token_ids"] == []
    assert h.sched.hook_stats[f"children_{child['state']}"] == 1
    no_child_outputs(h)
    assert_clean(h, initial_free)


@MODES
def test_one_of_two_children_aborted(async_sched):
    h = SchedHarness(async_sched)
    h.add("r", prompt(16), max_tokens=40, script=[P, 41, E, P, 42, E, S, 43, EOS])
    c0, c1 = child_id("r", 0), child_id("r", 1)
    h.scripts[c0] = [60 + i for i in range(30)]
    h.scripts[c1] = [70, 71, EOS]
    h.run_until(lambda: "r" in h.sched.requests and h.sched.requests["r"].status
                == RequestStatus.WAITING_FOR_STREAMING_REQ, max_steps=40)
    h.abort(c0)
    h.run(max_steps=40)
    # An aborted child contributes nothing (its separator stays: promise order).
    assert h.tokens["r"] == [P, 41, E, P, 42, E, S, SEP, 70, 71, 43, EOS]
    states = [c["state"] for c in h.trace("r")["children"]]
    assert states == ["aborted", "merged"]


# ---------------------------------------------------------------------------
# 8. Memory pressure
# ---------------------------------------------------------------------------
def _pressure_run(async_sched: bool, num_blocks: int, max_steps: int = 400,
                  policy: str = "fcfs"):
    h = SchedHarness(
        async_sched,
        block_size=16,
        num_blocks=num_blocks,
        max_model_len=160,
        max_num_seqs=8,
        max_num_batched_tokens=256,
        policy=policy,
        include_finished_set=True,
    )
    initial_free = h.free_blocks()
    for i, rid in enumerate(("a", "b")):
        # 64-token prompts: 4 full blocks each, 5 once decoding starts.
        h.add(rid, prompt(64, base=30 + i), max_tokens=40, priority=i,
              script=[40, P, 41, 42, E, 43, S, 44, 45, EOS])
        h.scripts[child_id(rid, 0)] = [50 + i] + [60 + (k % 30) for k in range(29)] + [EOS]
    steps = h.run(max_steps=max_steps)
    return h, initial_free, steps


@MODES
@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_memory_pressure_spills_parked_parents(async_sched, policy):
    """Two parked parents hold nearly all KV blocks while their children need
    more: parked parents are spilled, everything finishes with the tokens of
    an unpressured run, and all blocks are free at the end."""
    ref, ref_free, _ = _pressure_run(async_sched, num_blocks=200, policy=policy)
    assert ref.sched.hook_stats["spills"] == 0
    h, initial_free, steps = _pressure_run(async_sched, num_blocks=12, policy=policy)
    assert steps <= 300
    assert h.sched.hook_stats["spills"] >= 1
    assert h.preempted  # the children also got preempted on the way
    # Multi-client bookkeeping: parents reported finished, children never.
    assert h.finished_sets == {"a", "b"}
    for rid in ("a", "b"):
        assert h.finish_reasons[rid] == FinishReason.STOP
        assert h.tokens[rid] == ref.tokens[rid]
    no_child_outputs(h)
    assert_clean(h, initial_free)
    assert_clean(ref, ref_free)


def _idle_holder_run(async_sched: bool, num_blocks: int):
    h = SchedHarness(async_sched, block_size=16, num_blocks=num_blocks, max_model_len=160,
                     max_num_seqs=16, max_num_batched_tokens=512, include_finished_set=True)
    spills = []
    spill = h.sched.kv_pressure.spill

    def spy(st):
        spills.append((st.request.request_id, len(h.sched.running)))
        return spill(st)

    h.sched.kv_pressure.spill = spy
    initial_free = h.free_blocks()
    for i, rid in enumerate(("a", "b", "c", "d")):
        h.add(rid, prompt(64, base=30 + i), max_tokens=40,
              script=[40, P, 41, E, P, 42, E, S, 44, EOS])
        for k in range(2):
            h.scripts[child_id(rid, k)] = [50 + i] + [60 + (j % 30) for j in range(24)] + [EOS]
    steps = h.run(max_steps=600)
    return h, initial_free, steps, spills


@MODES
def test_children_waiting_for_blocks_spill_a_parent_that_only_waits(async_sched):
    """Four families in a cache that holds about two: parents park while their
    children wait for blocks that other parked parents hold. A parked parent
    none of whose children has started is spilled while other requests run
    (its blocks go to the prefix cache), so more children run at once; the
    tokens are those of an unpressured run and everything is freed."""
    ref, ref_free, ref_steps, ref_spills = _idle_holder_run(async_sched, num_blocks=200)
    assert ref_spills == []
    h, initial_free, steps, spills = _idle_holder_run(async_sched, num_blocks=24)
    assert any(running > 0 for _, running in spills), spills
    # deterministic step count; 98 with spilling only when nothing runs
    assert steps <= 80, steps
    assert h.finished_sets == {"a", "b", "c", "d"}
    for rid in ("a", "b", "c", "d"):
        assert h.finish_reasons[rid] == FinishReason.STOP
        assert h.tokens[rid] == ref.tokens[rid]
    no_child_outputs(h)
    assert_clean(h, initial_free)
    assert_clean(ref, ref_free)


@MODES
def test_abort_spilled_parent(async_sched):
    h = SchedHarness(async_sched, block_size=16, num_blocks=12, max_model_len=160,
                     max_num_seqs=8, max_num_batched_tokens=256)
    initial_free = h.free_blocks()
    for i, rid in enumerate(("a", "b")):
        h.add(rid, prompt(64, base=30 + i), max_tokens=40,
              script=[40, P, 41, 42, E, 43, S, 44, 45, EOS])
        h.scripts[child_id(rid, 0)] = [60 + (k % 30) for k in range(30)] + [EOS]
    h.run_until(lambda: h.sched.hook_stats["spills"] >= 1, max_steps=100)
    states = h.sched.fork_join.states
    spilled = [r for r in ("a", "b") if r in states and states[r].parked
               and states[r].spilled_frontier is not None
               and h.sched.requests[r].status == RequestStatus.WAITING_FOR_STREAMING_REQ]
    assert spilled
    mark = len(h.output_log)
    h.abort(spilled)
    h.run(max_steps=200)
    assert not {o.request_id for o in outputs_since(h, mark)} & set(spilled)
    for rid in {"a", "b"} - set(spilled):
        assert h.finish_reasons[rid] == FinishReason.STOP
    assert_clean(h, initial_free)


# ---------------------------------------------------------------------------
# 9. Limits
# ---------------------------------------------------------------------------
@MODES
@pytest.mark.parametrize("where", ["config", "request"])
def test_max_children_per_request(async_sched, where):
    hooks = {"max_children_per_request": 1} if where == "config" else {}
    extra = {"seqhooks_max_children_per_request": 1} if where == "request" else None
    h = SchedHarness(async_sched, hooks=hooks)
    initial_free = h.free_blocks()
    L = 16
    h.add("r", prompt(L), max_tokens=40,
          script=[P, 41, E, P, 42, E, S, 43, EOS], extra_args=extra)
    h.scripts[child_id("r", 0)] = [60, EOS]
    ever = set()
    h.after_schedule.append(lambda hh, out: ever.update(hh.sched.requests))
    h.run(max_steps=60)
    assert child_id("r", 1) not in ever
    assert h.tokens["r"] == [P, 41, E, P, 42, E, S, 60, 43, EOS]
    trace = h.trace("r")
    assert len(trace["children"]) == 1
    assert trace["ignored_promises"] == [
        {"position": L + 3, "reason": "max_children_per_request"}
    ]
    assert h.sched.hook_stats["promises_ignored"] == 1
    assert_clean(h, initial_free)


@MODES
@pytest.mark.parametrize(
    "extra",
    [{"seqhooks_enabled": False}, {"seqhooks_enabled": "false"},
     {"seqhooks_max_child_depth": 0}, {"seqhooks_max_child_depth": -1}],
    ids=["disabled", "disabled_str", "depth0", "invalid"],
)
def test_per_request_hooks_off(async_sched, extra):
    """Hooks off for one request (or an invalid override): its hook tokens
    are plain text, next to a request that still forks."""
    h = SchedHarness(async_sched)
    initial_free = h.free_blocks()
    h.add("off", prompt(16), max_tokens=20, script=[P, 41, E, S, 43, EOS], extra_args=extra)
    h.add("on", prompt(16, base=31), max_tokens=20, script=[P, 41, E, S, 43, EOS])
    h.scripts[child_id("on", 0)] = [60, EOS]
    h.run(max_steps=40)
    assert h.tokens["off"] == [P, 41, E, S, 43, EOS]
    assert h.trace("off") is None
    assert h.tokens["on"] == [P, 41, E, S, 60, 43, EOS]
    assert h.sched.hook_stats["children_spawned"] == 1
    assert_clean(h, initial_free)


@MODES
def test_per_request_child_max_tokens(async_sched):
    h = SchedHarness(async_sched)
    h.add("r", prompt(16), max_tokens=30, script=[P, 41, E, S, 43, EOS],
          extra_args={"seqhooks_child_max_tokens": 3})
    h.scripts[child_id("r", 0)] = [60 + i for i in range(10)]
    h.run(max_steps=40)
    assert h.tokens["r"] == [P, 41, E, S, 60, 61, 62, 43, EOS]
    assert h.trace("r")["children"][0]["finish_reason"] == str(FinishReason.LENGTH)


@MODES
def test_max_child_depth_default_children_do_not_spawn(async_sched):
    h = SchedHarness(async_sched)
    initial_free = h.free_blocks()
    h.add("r", prompt(16), max_tokens=40, script=[P, 41, E, S, 43, EOS])
    cid = child_id("r", 0)
    # The child writes hook tokens: at depth 1 (= max_child_depth) they are text.
    h.scripts[cid] = [60, P, 61, E, S, 62, EOS]
    ever = set()
    h.after_schedule.append(lambda hh, out: ever.update(hh.sched.requests))
    h.run(max_steps=60)
    assert not any(r.count("@seqhooks-child") > 1 for r in ever)
    assert h.tokens["r"] == [P, 41, E, S, 60, P, 61, E, S, 62, 43, EOS]
    child = h.trace("r")["children"][0]
    assert child["children"] == []
    assert h.sched.hook_stats["children_spawned"] == 1
    assert_clean(h, initial_free)


@MODES
def test_max_child_depth_zero_disables_spawning(async_sched):
    h = SchedHarness(async_sched, hooks={"max_child_depth": 0})
    h.add("r", prompt(16), max_tokens=40, script=[P, 41, E, S, 43, EOS])
    h.run(max_steps=40)
    assert h.tokens["r"] == [P, 41, E, S, 43, EOS]
    assert h.sched.hook_stats["children_spawned"] == 0


@MODES
def test_nested_children_depth_two(async_sched):
    h = SchedHarness(async_sched, hooks={"max_child_depth": 2})
    initial_free = h.free_blocks()
    h.add("r", prompt(16), max_tokens=40, script=[P, 41, E, S, 43, EOS])
    cid = child_id("r", 0)
    gid = child_id(cid, 0)
    h.scripts[cid] = [60, P, 61, E, S, 62, EOS]
    h.scripts[gid] = [70, 71, EOS]
    h.run(max_steps=80)
    # The grandchild's output is merged into the child, the child's (merged
    # tokens included) into the parent.
    assert h.tokens["r"] == [P, 41, E, S, 60, P, 61, E, S, 70, 71, 62, 43, EOS]
    trace = h.trace("r")
    assert trace["children"][0]["children"][0]["key"] == "0.0"
    assert trace["children"][0]["output_token_ids"] == [60, P, 61, E, S, 70, 71, 62]
    assert_clean(h, initial_free)


@MODES
def test_nested_child_join_output_stays_in_engine(async_sched):
    h = SchedHarness(async_sched, hooks={"max_child_depth": 2})
    h.add("r", prompt(16), max_tokens=40, script=[P, 41, E, S, 43, EOS])
    cid = child_id("r", 0)
    h.scripts[cid] = [60, P, 61, E, S, 62, EOS]
    h.scripts[child_id(cid, 0)] = [70, 71, EOS]
    h.run(max_steps=80)
    assert h.tokens["r"] == [P, 41, E, S, 60, P, 61, E, S, 70, 71, 62, 43, EOS]
    no_child_outputs(h)


@MODES
@pytest.mark.parametrize("target", ["root", "middle"])
def test_nested_abort_while_child_parked(async_sched, target):
    h = SchedHarness(async_sched, hooks={"max_child_depth": 2})
    initial_free = h.free_blocks()
    h.add("r", prompt(16), max_tokens=40, script=[P, 41, E, S, 43, EOS])
    cid = child_id("r", 0)
    gid = child_id(cid, 0)
    h.scripts[cid] = [60, P, 61, E, S, 62, EOS]
    h.scripts[gid] = [70 + i for i in range(30)]
    h.run_until(lambda: cid in h.sched.requests and h.sched.requests[cid].status
                == RequestStatus.WAITING_FOR_STREAMING_REQ, max_steps=40)
    assert h.sched.requests["r"].status == RequestStatus.WAITING_FOR_STREAMING_REQ
    mark = len(h.output_log)
    aborted = {r.request_id for r in h.abort("r" if target == "root" else cid)}
    if target == "root":
        assert aborted == {"r", cid, gid}
        h.run(max_steps=40)
        assert not {o.request_id for o in outputs_since(h, mark)} & {"r", cid, gid}
    else:
        assert aborted == {cid, gid}
        h.run(max_steps=40)
        # The parent joins the aborted child (nothing merged) and goes on.
        assert h.tokens["r"] == [P, 41, E, S, 43, EOS]
        assert h.trace("r")["children"][0]["state"] == "aborted"
    assert_clean(h, initial_free)


# ---------------------------------------------------------------------------
# 10. max_model_len reached by a merge
# ---------------------------------------------------------------------------
@MODES
def test_merge_truncated_at_max_model_len(async_sched):
    max_len = 64
    h = SchedHarness(async_sched, block_size=16, num_blocks=16, max_model_len=max_len)
    initial_free = h.free_blocks()
    L = 50
    h.add("r", prompt(L), max_tokens=40, script=[P, 41, E, S, 43, EOS])
    cid = child_id("r", 0)
    h.scripts[cid] = [60 + i for i in range(30)]
    h.run(max_steps=60)
    sync_len = L + 4  # parent tokens through <sync>
    room = max_len - sync_len
    toks = h.tokens["r"]
    assert h.finish_reasons["r"] == FinishReason.LENGTH
    assert toks[:4] == [P, 41, E, S]
    merged = toks[4:]
    assert len(merged) == room
    assert merged == [60 + i for i in range(room)]
    assert L + len(toks) == max_len
    j = h.trace("r")["joins"][0]
    assert j["truncated"] is True and j["merged_tokens"] == room
    assert h.sched.hook_stats["truncated_merges"] == 1
    assert_clean(h, initial_free)


@MODES
def test_merge_leaving_room_resumes(async_sched):
    max_len = 64
    h = SchedHarness(async_sched, block_size=16, num_blocks=16, max_model_len=max_len)
    L = 40
    h.add("r", prompt(L), max_tokens=40, script=[P, 41, E, S, 43, 44, 45, 46, 47])
    cid = child_id("r", 0)
    h.scripts[cid] = [60, 61, 62, EOS]
    h.run(max_steps=60)
    toks = h.tokens["r"]
    assert toks[:7] == [P, 41, E, S, 60, 61, 62]
    # The parent resumes and stops at max_model_len.
    assert L + len(toks) == max_len
    assert h.finish_reasons["r"] == FinishReason.LENGTH
    assert h.trace("r")["joins"][0]["truncated"] is False


# ---------------------------------------------------------------------------
# 11. No hook tokens: stock vLLM behaviour
# ---------------------------------------------------------------------------
def _stock_workload(h: SchedHarness) -> None:
    h.add("a", prompt(40), max_tokens=12, script=[41, 42, 43, EOS])
    h.add("b", prompt(100, base=31), max_tokens=20)
    # Hook tokens in the *prompt* are not hooks.
    h.add("c", [P, 41, E, S] + prompt(30), max_tokens=9, stop_token_ids=[55],
          script=[44, 45, 55])
    h.add("d", prompt(70, base=33), max_tokens=25)
    h.add("e", prompt(17, base=34), max_tokens=30, script=[46, 47])


def _transcript(h: SchedHarness):
    outs = [
        [(o.request_id, list(o.new_token_ids), o.finish_reason, o.stop_reason,
          o.kv_transfer_params) for o in step]
        for step in h.output_log
    ]
    return h.schedules, outs


@STEP_EXACT
@MODES
@pytest.mark.parametrize("num_blocks", [200, 14], ids=["roomy", "preempting"])
def test_no_hook_tokens_matches_stock_scheduler(async_sched, num_blocks):
    kwargs = dict(block_size=16, num_blocks=num_blocks, max_num_seqs=4,
                  max_model_len=160, max_num_batched_tokens=64)
    stock = SchedHarness(async_sched, stock=True, **kwargs)
    hooked = SchedHarness(async_sched, **kwargs)
    for h in (stock, hooked):
        _stock_workload(h)
        h.run(max_steps=400)
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm_seqhooks.engine.scheduler import SeqHooksAsyncScheduler, SeqHooksSyncScheduler

    expected_cls = SeqHooksAsyncScheduler if async_sched else SeqHooksSyncScheduler
    assert type(hooked.sched) is expected_cls
    assert isinstance(stock.sched, AsyncScheduler) == async_sched
    assert _transcript(hooked) == _transcript(stock)
    assert set(hooked.finish_reasons) == {"a", "b", "c", "d", "e"}
    if num_blocks == 14:
        assert hooked.preempted and hooked.preempted == stock.preempted
    assert hooked.sched.hook_state_sizes() == ZERO_STATE


# ---------------------------------------------------------------------------
# Preemption hazards (async scheduling: an in-flight step of a preempted
# request still delivers its token)
# ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "async_sched",
    [
        False,
        True,
    ],
    ids=["sync", "async"],
)
def test_parent_preempted_with_sync_in_flight(async_sched):
    """KV pressure preempts the parent at the step right after the one that
    samples <sync>.  Sync scheduling: the sync was processed before, the
    parent parks, and either it is spilled before the next step needs its
    blocks or (with drafted tokens) a running request is preempted; async:
    the sync arrives as the stale output of a preempted request."""
    h = SchedHarness(async_sched, block_size=16, num_blocks=9, max_num_seqs=8,
                     max_model_len=128, enable_prefix_caching=False)
    initial_free = h.free_blocks()
    h.add("b", prompt(60), max_tokens=30)
    h.add("p", prompt(40, base=31), max_tokens=40,
          script=[40, P, 41, E, 42, 43, 44, 45, S, 46, 47, EOS])
    h.scripts[child_id("p", 0)] = [60, 61, 62, EOS]
    h.run(max_steps=200)
    assert h.finish_reasons.get("b") == FinishReason.LENGTH
    assert h.tokens["p"] == [40, P, 41, E, 42, 43, 44, 45, S, 60, 61, 62, 46, 47, EOS]
    assert h.finish_reasons.get("p") == FinishReason.STOP
    stats = h.sched.hook_stats
    if async_sched:
        assert stats["preemptions"] >= 1
    else:
        assert stats["preemptions"] + stats["spills"] >= 1
    assert_clean(h, initial_free)


@pytest.mark.parametrize(
    "async_sched",
    [
        False,
        True,
    ],
    ids=["sync", "async"],
)
def test_parent_preempted_with_eos_in_flight(async_sched):
    h = SchedHarness(async_sched, block_size=16, num_blocks=9, max_num_seqs=8,
                     max_model_len=128, enable_prefix_caching=False)
    initial_free = h.free_blocks()
    h.add("b", prompt(60), max_tokens=11)
    h.add("p", prompt(40, base=31), max_tokens=40,
          script=[40, P, 41, E, 42, 43, 44, 45, EOS])
    h.scripts[child_id("p", 0)] = [60, 61, 62, EOS]
    h.run(max_steps=200)
    assert h.finish_reasons.get("b") == FinishReason.LENGTH
    assert h.tokens["p"] == [40, P, 41, E, 42, 43, 44, 45, 60, 61, 62, EOS]
    assert h.finish_reasons.get("p") == FinishReason.STOP
    assert_clean(h, initial_free)


@MODES
def test_parent_preempted_before_sync(async_sched):
    """The parent is preempted (KV pressure) while its child waits; with async
    scheduling the step in flight at the preemption delivers </promise> (the
    spawn comes from a stale output).  The parent is recomputed, then syncs
    and joins normally."""
    h = SchedHarness(async_sched, block_size=16, num_blocks=9, max_num_seqs=8,
                     max_model_len=128, enable_prefix_caching=False)
    initial_free = h.free_blocks()
    h.add("b", prompt(60), max_tokens=30)
    script = [40, P, 41, 42, 43, 44, 45, 46, E, 47, 48, 49, 50, 51, 52, S, 53, EOS]
    h.add("p", prompt(40, base=31), max_tokens=40, script=script)
    h.scripts[child_id("p", 0)] = [60, 61, 62, EOS]
    h.run(max_steps=200)
    assert "p" in h.preempted
    assert h.tokens["p"] == script[:16] + [60, 61, 62] + script[16:]
    assert h.finish_reasons["p"] == FinishReason.STOP
    assert h.trace("p")["children"][0]["payload_token_ids"] == [41, 42, 43, 44, 45, 46]
    assert_clean(h, initial_free)


# ---------------------------------------------------------------------------
# Request ids and streaming-input sessions
# ---------------------------------------------------------------------------
@MODES
def test_client_request_id_with_child_marker(async_sched):
    h = SchedHarness(async_sched)
    h.add("x@seqhooks-child0", prompt(10), max_tokens=5)
    h.add("r", prompt(12), max_tokens=20, script=[P, 41, E, 42, 43, 44, 45, 46, S, 47, EOS])
    h.scripts[child_id("r", 0)] = [60, EOS]
    h.run(max_steps=40)
    assert h.finish_reasons.get("r") == FinishReason.STOP
    assert len(h.tokens["x@seqhooks-child0"]) == 5
    assert h.finish_reasons.get("x@seqhooks-child0") == FinishReason.LENGTH
    assert h.sched.hook_state_sizes() == ZERO_STATE


def _streaming_session(h: SchedHarness, script):
    from tests.support.sched_harness import make_request

    req = make_request("r", prompt(10), block_size=h.block_size, max_tokens=30,
                       resumable=True)
    h.scripts["r"] = script
    h.sched.add_request(req)
    h.run(max_steps=40)
    return req


@UPSTREAM_SESSIONS
@MODES
def test_streaming_session_without_hooks_stays_resumable(async_sched):
    """Control: a streaming-input session (resumable request) that stops at
    EOS waits for its next input chunk, as with stock vLLM."""
    h = SchedHarness(async_sched)
    req = _streaming_session(h, [40, 41, S, 42, EOS])
    assert h.tokens["r"] == [40, 41, S, 42, EOS]
    assert req.resumable
    assert h.sched.requests.get("r") is req
    assert req.status == RequestStatus.WAITING_FOR_STREAMING_REQ


@UPSTREAM_SESSIONS
@MODES
def test_streaming_session_has_no_hooks_and_stays_resumable(async_sched):
    """vLLM's own streaming-input sessions park and resume through the path
    hooks use: hooks are off for them (hook tokens are plain text), and the
    session keeps waiting for its next input chunk."""
    h = SchedHarness(async_sched)
    h.scripts[child_id("r", 0)] = [60, 61, EOS]
    req = _streaming_session(h, [40, P, 41, E, S, 42, EOS])
    assert h.tokens["r"] == [40, P, 41, E, S, 42, EOS]
    assert child_id("r", 0) not in h.tokens
    assert req.resumable
    assert h.sched.requests.get("r") is req
    assert req.status == RequestStatus.WAITING_FOR_STREAMING_REQ


@MODES
def test_per_request_merge_separator_without_tokenizer(async_sched):
    h = SchedHarness(async_sched)
    h.add("r", prompt(16), max_tokens=20, script=[P, 41, E, S, 43, EOS],
          extra_args={"seqhooks_merge_separator": "--"})
    h.scripts[child_id("r", 0)] = [60, EOS]
    h.run(max_steps=40)
    assert h.finish_reasons["r"] == FinishReason.STOP


@MODES
@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_children_are_admitted_before_requests_that_have_not_started(async_sched, policy):
    """A parked parent holds its KV blocks until its children finish: a child
    must not queue behind parents that arrived later and have not started
    (they would park too and fill the cache)."""
    h = SchedHarness(async_sched, max_num_seqs=2, policy=policy)
    h.add("a", prompt(16), max_tokens=20, script=[P, 41, E, S, 43, EOS])
    h.scripts[child_id("a", 0)] = [60, 61, 62, EOS]
    h.add("b", prompt(16, base=31), max_tokens=12)
    h.add("c", prompt(16, base=32), max_tokens=12)
    h.run(max_steps=200)
    first = {rid: next(i for i, s in enumerate(h.schedules) if rid in s)
             for rid in ("a", "b", "c", child_id("a", 0))}
    assert first[child_id("a", 0)] < first["c"], first
    assert h.tokens["a"] == [P, 41, E, S, 60, 61, 62, 43, EOS]
    assert h.finish_reasons["c"] == FinishReason.LENGTH
