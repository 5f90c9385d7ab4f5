"""Speculative decoding and ``<sync>``: several tokens a step.

A verifying model returns the accepted drafts plus one token, so ``<sync>``
can arrive first, in the middle or last of a step's tokens, followed in the
same step by EOS, a stop token, the ``max_tokens`` limit or another
``<promise>``. Whatever the position, the scheduler must keep the tokens up
to ``<sync>``, drop the rest before vLLM appends them, checks them for a
stop or caches blocks holding them, and resume the parent after the merge,
so that every request's tokens, merges and finish reasons equal those of
one token a step (k=0). Both scheduler bases; invariants after every step.
"""

from __future__ import annotations

import pytest

from tests.support.sched_harness import (
    EOS_ID as EOS,
    PROMISE_END_ID as E,
    PROMISE_ID as P,
    SYNC_ID as S,
    SchedHarness,
    child_id,
    make_request,
)

MODES = pytest.mark.parametrize("async_sched", [False, True], ids=["sync", "async"])
SPEC = pytest.mark.parametrize("k", [1, 2, 3, 4])
BLOCK = 16
CHILD_FIELDS = ("key", "payload_token_ids", "prompt_tokens", "output_token_ids",
                "sampled_tokens", "state", "finish_reason")


def prompt(n: int, base: int = 30) -> list[int]:
    return [base + (i % 50) for i in range(n)]


def varied(rid: str, index: int, drafts: int) -> int:
    """A deterministic mix of full, partial and no acceptance."""
    return (sum(map(ord, rid)) * 7 + index * 3) % (drafts + 1)


def run(async_sched: bool, k: int, requests, scripts, *, acceptance=None,
        hooks=None, max_steps: int = 300):
    """Run ``requests`` (id -> (prompt, kwargs)) and return the harness, with
    every token sequence the requests held after each step recorded."""
    h = SchedHarness(async_sched, num_spec_tokens=k, acceptance=acceptance,
                     hooks=hooks or {}, block_size=BLOCK, num_blocks=96)
    h.initial_free = h.free_blocks()
    h.scripts.update({key: list(v) for key, v in scripts.items()})
    h.sequences = set()

    def record(hh, _outs):
        for req in hh.sched.requests.values():
            hh.sequences.add(tuple(req.all_token_ids))

    h.after_update.append(record)
    free_request = h.sched._free_request

    def record_at_free(request, *args, **kwargs):
        h.sequences.add(tuple(request.all_token_ids))
        return free_request(request, *args, **kwargs)

    h.sched._free_request = record_at_free
    for rid, (pr, kwargs) in requests.items():
        h.add(rid, pr, **kwargs)
    h.run(max_steps=max_steps)
    return h


def transcript(h: SchedHarness) -> dict:
    """What a client sees, and what each child contributed."""
    out = {}
    for rid, reason in h.finish_reasons.items():
        trace = h.trace(rid) or {}
        out[rid] = (
            h.tokens[rid],
            reason,
            [tuple(c.get(f) for f in CHILD_FIELDS) for c in trace.get("children", [])],
            [j["merged_tokens"] for j in trace.get("joins", [])],
        )
    return out


def assert_no_stale_cached_blocks(h: SchedHarness) -> None:
    """Every block in the prefix cache holds tokens some request really had
    (never tokens dropped after a ``<sync>``)."""
    valid = set()
    for seq in h.sequences:
        probe = make_request("probe", list(seq), block_size=BLOCK)
        valid.update(bytes(b) for b in probe.block_hashes)
    pool = h.sched.kv_cache_manager.block_pool
    for block in pool.blocks:
        key = block.block_hash
        if key is None:
            continue
        assert bytes(key[:-4]) in valid, f"block {block.block_id} cached with stale tokens"


def assert_clean(h: SchedHarness) -> None:
    sched = h.sched
    assert not sched.requests, list(sched.requests)
    assert sched.hook_state_sizes() == {k: 0 for k in sched.hook_state_sizes()}
    assert sched.num_waiting_for_streaming_input == 0
    assert h.free_blocks() == h.initial_free
    assert not h.outputs_after_finish


def check_against_k0(async_sched, k, requests, scripts, *, hooks=None, acceptance=None):
    base = run(async_sched, 0, requests, scripts, hooks=hooks)
    spec = run(async_sched, k, requests, scripts, hooks=hooks, acceptance=acceptance)
    assert transcript(spec) == transcript(base)
    assert_no_stale_cached_blocks(spec)
    assert_clean(spec)
    return base, spec


# ---------------------------------------------------------------------------
# <sync> at every position of an accepted run
# ---------------------------------------------------------------------------
@MODES
@SPEC
@pytest.mark.parametrize("lead", range(5), ids=lambda n: f"lead{n}")
def test_sync_at_each_position_of_a_run(async_sched, k, lead):
    """``lead`` plain tokens shift where ``<sync>`` falls in the runs of
    k+1 tokens: first, middle or last."""
    script = [40 + i for i in range(lead)] + [P, 41, 42, E, 43, S, 44, 45, EOS]
    requests = {"r": (prompt(20), dict(max_tokens=40))}
    scripts = {"r": script, child_id("r", 0): [60, 61, 62, EOS]}
    base, spec = check_against_k0(async_sched, k, requests, scripts)
    assert base.tokens["r"] == script[: lead + 6] + [60, 61, 62] + [44, 45, EOS]


@MODES
@SPEC
def test_varied_acceptance_many_families(async_sched, k):
    requests, scripts = {}, {}
    for i in range(4):
        rid = f"f{i}"
        requests[rid] = (prompt(18 + i, base=30 + i), dict(max_tokens=60))
        scripts[rid] = ([40] * i + [P, 41, E, P, 42, 43, E, 44, S, 45, P, 46, E, S, 47, EOS])
        scripts[child_id(rid, 0)] = [60 + i, 61, EOS]
        scripts[child_id(rid, 1)] = [70 + i, 71, 72, 73, EOS]
        scripts[child_id(rid, 2)] = [80 + i, EOS]
    check_against_k0(async_sched, k, requests, scripts, acceptance=varied)


# ---------------------------------------------------------------------------
# What follows <sync> in the same step
# ---------------------------------------------------------------------------
@MODES
@SPEC
@pytest.mark.parametrize("after", ["eos", "stop_token", "max_tokens", "promise"])
def test_sync_followed_in_the_same_step(async_sched, k, after):
    """EOS, a stop token, the last token ``max_tokens`` allows or a
    ``<promise>`` right after ``<sync>``: the parent still parks, merges and
    resumes (a token after ``<sync>`` is sampled again after the merge)."""
    head = [40, P, 41, E, S]
    kwargs = dict(max_tokens=40)
    if after == "eos":
        script = head + [EOS]
    elif after == "stop_token":
        script = head + [99, 50]
        kwargs["stop_token_ids"] = [99]
    elif after == "max_tokens":
        script = head + [50, 51, 52]
        kwargs["max_tokens"] = len(head) + 1
    else:
        script = head + [P, 42, E, S, 53, EOS]
    requests = {"r": (prompt(20), kwargs)}
    scripts = {"r": script, child_id("r", 0): [60, 61, EOS], child_id("r", 1): [70, EOS]}
    for lead in range(k + 1):  # every alignment of <sync> in the runs
        shifted = {"r": [30] * lead + script, **{c: v for c, v in scripts.items() if c != "r"}}
        if after == "max_tokens":
            requests = {"r": (prompt(20), dict(max_tokens=len(head) + 1 + lead))}
        base, spec = check_against_k0(async_sched, k, requests, shifted)
        tokens = base.tokens["r"]
        assert tokens[lead + len(head): lead + len(head) + 2] == [60, 61]


@MODES
@SPEC
@pytest.mark.parametrize("closer", ["promise_end", "sync"])
def test_payload_closing_in_the_same_run_as_sync(async_sched, k, closer):
    """A payload closed by ``</promise>`` (or, without that token, by
    ``<sync>`` itself) in the same step as the ``<sync>`` that waits for it."""
    if closer == "promise_end":
        hooks, script = {}, [P, 41, E, S, 44, EOS]
    else:
        hooks, script = {"promise_end_token_id": None}, [P, 41, 42, S, 44, EOS]
    for lead in range(k + 1):
        requests = {"r": (prompt(20), dict(max_tokens=30))}
        scripts = {"r": [30] * lead + script, child_id("r", 0): [60, 61, EOS]}
        base, spec = check_against_k0(async_sched, k, requests, scripts, hooks=hooks)
        assert base.trace("r")["children"][0]["output_token_ids"] == [60, 61]


@MODES
@SPEC
def test_nested_children_sync_inside_runs(async_sched, k):
    requests = {"r": (prompt(20), dict(max_tokens=40))}
    c0 = child_id("r", 0)
    scripts = {
        "r": [40, P, 41, E, S, 42, EOS],
        c0: [50, P, 51, E, S, 52, EOS],
        child_id(c0, 0): [60, 61, 62, EOS],
    }
    check_against_k0(async_sched, k, requests, scripts, hooks={"max_child_depth": 2},
                     acceptance=varied)


@MODES
@SPEC
def test_child_budget_counts_only_tokens_before_the_closing_token(async_sched, k):
    """Without ``child_max_tokens`` a child gets the parent's budget left
    when ``</promise>`` was sampled, not after the step's later tokens."""
    requests = {"r": (prompt(20), dict(max_tokens=12))}
    scripts = {"r": [P, 41, E, 42, 43, S, 44, EOS], child_id("r", 0): [60 + i for i in range(20)]}
    base, spec = check_against_k0(async_sched, k, requests, scripts)
    assert base.trace("r")["children"][0]["output_token_ids"] == [60 + i for i in range(9)]


# ---------------------------------------------------------------------------
# A stop in the middle of a step's tokens, with open children
# ---------------------------------------------------------------------------
@MODES
@pytest.mark.parametrize("k", [2, 3])
def test_a_parent_stopped_inside_a_run_parks_with_its_kv_up_to_the_stop(async_sched, k):
    """EOS in the middle of a step's accepted tokens, its child still open:
    vLLM cuts the tokens after EOS and the parent parks (to finish after its
    merge) with every token but EOS computed: what vLLM cut is taken back
    once (vLLM 0.32 leaves it counted and the hooks take it back; 0.33 takes
    it back itself, and the hooks must not again:
    vllm_private.request_update_for_hooks)."""
    cut_at_park = []
    for lead in range(k + 1):  # every alignment of EOS in the runs
        script = [30] * lead + [P, 41, E, 42, EOS, 50, 51, 52]
        scripts = {"r": script, child_id("r", 0): [60] * 12 + [EOS]}
        h = SchedHarness(async_sched, num_spec_tokens=k, block_size=BLOCK, num_blocks=96)
        h.scripts.update(scripts)
        parked = []

        def at_park(hh, _outs):
            st = hh.sched.fork_join.states.get("r")
            if st is not None and st.parked and not parked:
                req = st.request
                parked.append((req.num_tokens, req.num_computed_tokens,
                               req.num_output_placeholders))

        h.after_update.append(at_park)
        h.add("r", prompt(20), max_tokens=40)
        h.run(max_steps=300)
        ((num_tokens, computed, placeholders),) = parked
        assert num_tokens == 20 + lead + 5  # through EOS: 50.. were cut
        assert computed + placeholders == num_tokens - 1
        assert h.tokens["r"] == script[: lead + 4] + [60] * 12 + [EOS]
        cut_at_park.append(computed)
    assert len(cut_at_park) == k + 1
