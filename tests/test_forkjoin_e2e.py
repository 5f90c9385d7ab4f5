"""Fork/join end to end through ``vllm_seqhooks.LLM`` on the tiny model
(in-process engine), with hook tokens forced by the scripted-token logits
processor. Oracles come from a stock ``vllm.LLM`` on the same weights."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

PROMPT = (
    "The quick brown fox jumps over the lazy dog; pack my box with five dozen "
    "liquor jugs."
)


@pytest.fixture(scope="module")
def engines(tiny_model_dir):
    import vllm

    from tests.support.forkjoin import Scripts, hook_llm
    from vllm_seqhooks.scripted.tiny_model import TINY_ENGINE_KWARGS

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        hooked = hook_llm(tiny_model_dir, hooks=dict(max_child_depth=2))
        stock = vllm.LLM(tiny_model_dir, **TINY_ENGINE_KWARGS)
        yield hooked, stock, Scripts(hooked.get_tokenizer())


def gen(llm, prompts, params):
    return llm.generate(prompts, params, use_tqdm=False)


def assert_engine_idle(llm):
    from tests.support.forkjoin import kv_blocks_in_use, scheduler_of

    sched = scheduler_of(llm)
    sizes = sched.hook_state_sizes()
    assert sizes == {k: 0 for k in sizes}, sizes
    assert kv_blocks_in_use(llm) == 0
    assert sched.num_waiting_for_streaming_input == 0


def test_scheduler_in_engine_is_ours(engines):
    from vllm_seqhooks.engine.scheduler import SeqHooksSyncScheduler
    from tests.support.forkjoin import scheduler_of

    hooked, stock, _ = engines
    sched = scheduler_of(hooked)
    assert isinstance(sched, SeqHooksSyncScheduler)
    assert sched.hooks.max_child_depth == 2
    assert type(scheduler_of(stock)).__module__.startswith("vllm.")


def test_join_merges_children_in_promise_order(engines):
    hooked, _, S = engines
    params = S.params(
        "ab<promise>xy</promise><promise>zw</promise>c<sync>done",
        {"0": "AAA", "1": "BBBB"},
    )
    out = gen(hooked, [PROMPT], params)[0]
    c = out.outputs[0]
    assert c.text == "ab<promise>xy</promise><promise>zw</promise>c<sync>AAA\nBBBBdone"
    assert c.finish_reason == "stop"
    trace = out.hook_trace
    assert [ch["key"] for ch in trace["children"]] == ["0", "1"]
    assert [ch["payload"] for ch in trace["children"]] == ["xy", "zw"]
    assert [ch["output"] for ch in trace["children"]] == ["AAA", "BBBB"]
    assert all(ch["state"] == "merged" for ch in trace["children"])
    (join,) = trace["joins"]
    assert join["children"] == ["0", "1"] and join["merged_tokens"] == 8
    assert_engine_idle(hooked)


def test_parent_continuation_matches_fresh_request(engines):
    """Exactness oracle: after a join the parent continues exactly as a fresh
    request given the same full context (greedy, float32)."""
    hooked, stock, S = engines
    prompt_ids = hooked.get_tokenizer().encode(PROMPT)
    script = S("<promise>xy</promise>c<sync>")
    n_free = 16
    params = S.params(script, {"0": "AAA"}, end="free", max_tokens=len(script) + n_free)
    out = gen(hooked, [{"prompt_token_ids": prompt_ids}], params)[0].outputs[0]
    merged = S("AAA")
    assert list(out.token_ids[: len(script) + len(merged)]) == script + merged
    continuation = list(out.token_ids[len(script) + len(merged):])
    assert len(continuation) == n_free
    import vllm

    ref = gen(
        stock,
        [{"prompt_token_ids": prompt_ids + script + merged}],
        vllm.SamplingParams(temperature=0, max_tokens=n_free),
    )[0].outputs[0]
    assert continuation == list(ref.token_ids)


def test_forked_child_matches_fresh_request(engines):
    hooked, stock, S = engines
    prompt_ids = hooked.get_tokenizer().encode(PROMPT)
    script = S("<promise>xy</promise><sync>")
    params = S.params(script, None, child_end=None,
                      extra_args={"seqhooks_child_max_tokens": 10})
    out = gen(hooked, [{"prompt_token_ids": prompt_ids}], params)[0]
    (child,) = out.hook_trace["children"]
    assert child["finish_reason"] == "length" and child["num_output_tokens"] == 10
    import vllm

    ref = gen(
        stock,
        [{"prompt_token_ids": prompt_ids + script[:-1]}],  # through </promise>
        vllm.SamplingParams(temperature=0, max_tokens=10),
    )[0].outputs[0]
    assert child["output_token_ids"] == list(ref.token_ids)
    # and the parent's text has the child's output right after <sync>
    assert out.outputs[0].text == "<promise>xy</promise><sync>" + ref.text


def test_prefill_at_join_and_fork_reuse(engines):
    """Engine-side counters: a join prefills only <sync> + merged tokens; a
    forked child computes at most one block of its prompt."""
    hooked, _, S = engines
    from tests.support.forkjoin import scheduler_of

    prompt_ids = hooked.get_tokenizer().encode(PROMPT * 2)
    script = S("hello<promise>xyz</promise>ab<sync>!")
    stats0 = dict(scheduler_of(hooked).hook_stats)
    out = gen(hooked, [{"prompt_token_ids": prompt_ids}], S.params(script, {"0": "ABCDEFG"}))[0]
    trace = out.hook_trace
    (join,) = trace["joins"]
    assert join["merged_tokens"] == 7
    assert join["prefilled_tokens"] == 7 + 1  # merged + the re-added <sync>
    sync_pos = len(prompt_ids) + script.index(S("<sync>")[0])
    assert join["reused_tokens"] == sync_pos  # everything before <sync> kept its KV
    (child,) = trace["children"]
    block = 32
    assert child["prompt_tokens"] == len(prompt_ids) + len(S("hello<promise>xyz</promise>"))
    assert child["cached_prompt_tokens"] == child["prompt_tokens"] // block * block
    assert child["prompt_tokens"] - child["cached_prompt_tokens"] <= block
    stats = scheduler_of(hooked).hook_stats
    assert stats["join_prefill_tokens"] - stats0["join_prefill_tokens"] == 8
    assert stats["fork_cached_tokens"] - stats0["fork_cached_tokens"] == child["cached_prompt_tokens"]


def test_fan_out_8_and_depth_2(engines):
    hooked, _, S = engines
    promises = "".join(f"<promise>t{i}</promise>" for i in range(8))
    children = {str(i): f"r{i}" for i in range(8)}
    # child 3 forks two grandchildren of its own and merges them
    children["3"] = "g<promise>u</promise><promise>v</promise><sync>."
    children["3.0"] = "G0"
    children["3.1"] = "G1"
    out = gen(hooked, [PROMPT], S.params(promises + "<sync>end", children))[0]
    merged3 = "g<promise>u</promise><promise>v</promise><sync>G0\nG1."
    expected_children = [f"r{i}" if i != 3 else merged3 for i in range(8)]
    assert out.outputs[0].text == promises + "<sync>" + "\n".join(expected_children) + "end"
    trace = out.hook_trace
    assert len(trace["children"]) == 8
    c3 = trace["children"][3]
    assert [g["key"] for g in c3["children"]] == ["3.0", "3.1"]
    assert all(g["depth"] == 2 for g in c3["children"])
    assert_engine_idle(hooked)


def test_depth_limit_makes_hooks_plain_text(engines):
    hooked, _, S = engines
    # max_child_depth=1 for this request: child "0" may not spawn
    params = S.params("<promise>a</promise><sync>", {"0": "x<promise>b</promise>y<sync>z"},
                      extra_args={"seqhooks_max_child_depth": 1})
    out = gen(hooked, [PROMPT], params)[0]
    assert out.outputs[0].text == "<promise>a</promise><sync>x<promise>b</promise>y<sync>z"
    (child,) = out.hook_trace["children"]
    assert child["children"] == []


def test_children_limit_leaves_extra_promises_as_text(engines):
    hooked, _, S = engines
    params = S.params(
        "<promise>a</promise><promise>b</promise><promise>c</promise><sync>",
        {"0": "A", "1": "B", "2": "C"},
        extra_args={"seqhooks_max_children_per_request": 2},
    )
    out = gen(hooked, [PROMPT], params)[0]
    assert out.outputs[0].text.endswith("<sync>A\nB")
    trace = out.hook_trace
    assert len(trace["children"]) == 2
    assert trace["ignored_promises"][0]["reason"] == "max_children_per_request"


def test_many_parents_in_one_batch(engines):
    hooked, _, S = engines
    params, expected = [], []
    for i in range(64):
        a, b = f"a{i}", f"b{i}"
        params.append(S.params(f"p{i}<promise>x</promise><promise>y</promise><sync>q",
                               {"0": a, "1": b}))
        expected.append(f"p{i}<promise>x</promise><promise>y</promise><sync>{a}\n{b}q")
    outs = gen(hooked, [f"{PROMPT} #{i}" for i in range(64)], params)
    assert [o.outputs[0].text for o in outs] == expected
    assert_engine_idle(hooked)


def test_sync_without_children_is_a_no_op(engines):
    hooked, _, S = engines
    out = gen(hooked, [PROMPT], S.params("ab<sync>cd"))[0]
    assert out.outputs[0].text == "ab<sync>cd"
    assert out.hook_trace is None


def test_payload_never_closed_spawns_at_end(engines):
    """A payload still open when the parent stops closes there; the parent
    waits for the child and appends its output before finishing."""
    hooked, _, S = engines
    out = gen(hooked, [PROMPT], S.params("ab<promise>xy", {"0": "CHILD"}))[0]
    c = out.outputs[0]
    assert c.finish_reason == "stop"
    assert c.text == "ab<promise>xyCHILD"
    (child,) = out.hook_trace["children"]
    assert child["payload"] == "xy"
    assert_engine_idle(hooked)


def test_parent_hitting_max_tokens_waits_for_children(engines):
    hooked, _, S = engines
    params = S.params("<promise>x</promise>abcdefgh", {"0": "LONGCHILD"}, max_tokens=5,
                      extra_args={"seqhooks_child_max_tokens": 20})
    out = gen(hooked, [PROMPT], params)[0]
    c = out.outputs[0]
    assert c.finish_reason == "length"
    assert c.text == "<promise>x</promise>ab" + "LONGCHILD"
    # without child_max_tokens a child gets the parent's remaining budget (2)
    out = gen(hooked, [PROMPT], S.params("<promise>x</promise>abcdefgh", {"0": "LONGCHILD"},
                                         max_tokens=5))[0]
    assert out.outputs[0].text == "<promise>x</promise>ab" + "LO"
    assert out.hook_trace["children"][0]["finish_reason"] == "length"
    assert_engine_idle(hooked)


def test_merge_truncated_at_max_model_len(engines):
    hooked, _, S = engines
    max_len = hooked.llm_engine.vllm_config.model_config.max_model_len
    script = S("<promise>x</promise><sync>more")
    prompt_ids = [70 + (i % 20) for i in range(max_len - len(script) - 5)]
    params = S.params(script, {"0": "C" * 30})
    out = gen(hooked, [{"prompt_token_ids": prompt_ids}], params)[0]
    c = out.outputs[0]
    assert c.finish_reason == "length"
    assert len(prompt_ids) + len(c.token_ids) == max_len
    assert c.text.startswith("<promise>x</promise><sync>CCC")
    assert out.hook_trace["joins"][0]["truncated"] is True
    assert_engine_idle(hooked)


def test_prompt_logprobs_with_hooks_are_rejected(engines):
    hooked, _, S = engines
    params = S.params("ab", prompt_logprobs=1)
    from vllm.exceptions import VLLMValidationError

    with pytest.raises(VLLMValidationError, match="prompt_logprobs"):
        gen(hooked, [PROMPT], params)
    # ... unless hooks are off for that request
    params = S.params("ab", prompt_logprobs=1, extra_args={"seqhooks_enabled": False})
    out = gen(hooked, [PROMPT], params)[0]
    assert out.outputs[0].text == "ab"
    # Sample logprobs are fine with hooks (tests/test_hook_logprobs.py).
    out = gen(hooked, [PROMPT], S.params("ab", logprobs=1))[0]
    assert len(out.outputs[0].logprobs) == len(out.outputs[0].token_ids)


def test_per_request_separator_and_usage_summary(engines):
    hooked, _, S = engines
    params = S.params("<promise>a</promise><promise>b</promise><sync>!", {"0": "XY", "1": "Z"},
                      extra_args={"seqhooks_merge_separator": " + "})
    out = gen(hooked, [PROMPT], params)[0]
    assert out.outputs[0].text == "<promise>a</promise><promise>b</promise><sync>XY + Z!"
    usage = out.hook_trace["usage"]
    assert usage["merged_tokens"] == len(S("XY + Z"))
    assert usage["num_children"] == 2
    assert usage["children_sampled_tokens"] == len(S("XY")) + 1 + len(S("Z")) + 1  # with EOS
    prompt_len = len(out.prompt_token_ids)
    assert usage["children_prompt_tokens"] == (prompt_len + 3) + (prompt_len + 6)
    # the parent's own sampled tokens = its output minus the merged tokens
    sampled = len(out.outputs[0].token_ids) - usage["merged_tokens"]
    assert sampled == len(S("<promise>a</promise><promise>b</promise><sync>!")) + 1


def test_invalid_per_request_settings_are_rejected(engines):
    from vllm.exceptions import VLLMValidationError

    hooked, _, S = engines
    with pytest.raises(VLLMValidationError, match="seqhooks_child_max_tokens"):
        gen(hooked, [PROMPT], S.params("ab", extra_args={"seqhooks_child_max_tokens": 0}))
    with pytest.raises(VLLMValidationError, match="seqhooks_enabled"):
        gen(hooked, [PROMPT], S.params("ab", extra_args={"seqhooks_enabled": "perhaps"}))
    with pytest.raises(VLLMValidationError, match="unknown.*request key.*'seqhooks_max_children' "
                       r"\(did you mean 'seqhooks_max_children_per_request'\?\).*known"):
        gen(hooked, [PROMPT], S.params("ab", extra_args={"seqhooks_max_children": 2}))
    # the engine keeps serving
    assert gen(hooked, [PROMPT], S.params("ok"))[0].outputs[0].text == "ok"


def test_hooks_off_for_one_request(engines):
    hooked, _, S = engines
    params = S.params("<promise>x</promise><sync>y", {"0": "C"},
                      extra_args={"seqhooks_enabled": False})
    out = gen(hooked, [PROMPT], params)[0]
    assert out.outputs[0].text == "<promise>x</promise><sync>y"
    assert out.hook_trace is None


def test_seeded_sampling_children_are_deterministic(engines):
    hooked, _, S = engines
    params = S.params("<promise>a</promise><promise>b</promise><sync>", None, child_end=None,
                      temperature=1.0, seed=1234,
                      extra_args={"seqhooks_child_max_tokens": 6})
    t1 = gen(hooked, [PROMPT], params)[0]
    t2 = gen(hooked, [PROMPT], params)[0]
    assert t1.outputs[0].text == t2.outputs[0].text
    o = [c["output_token_ids"] for c in t1.hook_trace["children"]]
    assert len(o) == 2 and all(len(x) == 6 for x in o)


def test_each_of_n_samples_is_its_own_family_with_its_own_trace(engines):
    """``n`` > 1 (GRPO groups): every sample forks and joins its own children,
    each completion keeps its own trace (vLLM's frontend alone would give
    all of them the last finished one's) and its own training row; seeded,
    the samples' children differ from each other and repeat run to run."""
    from vllm_seqhooks import get_hook_traces, rollout

    hooked, _, S = engines
    params = S.params("<promise>a</promise><promise>b</promise><sync>", None, child_end=None,
                      temperature=1.0, seed=99, n=3,
                      extra_args={"seqhooks_child_max_tokens": 6})
    out = gen(hooked, [PROMPT], params)[0]
    traces = out.hook_traces
    assert len(out.outputs) == len(traces) == 3 and out.hook_trace is traces[0]
    assert get_hook_traces(out) is traces
    assert [t["request_id"].split("_")[0] for t in traces] == ["0", "1", "2"]
    children = [[c["output_token_ids"] for c in t["children"]] for t in traces]
    assert all(len(c) == 2 and all(len(x) == 6 for x in c) for c in children)
    assert len({tuple(map(tuple, c)) for c in children}) == 3  # seed + index, derived
    rows = rollout.training_rows(out)
    for row, completion, trace, kids in zip(rows, out.outputs, traces, children):
        assert row["response_ids"] == list(completion.token_ids)
        merged = [t for t, key in zip(row["response_ids"], row["node_ids"]) if key == "0"]
        assert merged == kids[0]
    assert len({r["base_id"] for r in rollout.per_call_rows(out)}) == 3
    again = gen(hooked, [PROMPT], params)[0]
    assert [[c["output_token_ids"] for c in t["children"]] for t in again.hook_traces] == children
    # a group in which no sample forks (GRPO's short problems): plain rows for all
    plain = gen(hooked, [PROMPT], S.params("no hooks here", None, temperature=1.0,
                                           seed=99, n=8))[0]
    rows = rollout.training_rows(plain)
    assert plain.hook_traces == [None] and len(rows) == 8
    assert [r["response_ids"] for r in rows] == [list(c.token_ids) for c in plain.outputs]
    assert all(set(r["response_mask"]) == {1} and set(r["node_ids"]) == {""} for r in rows)
    assert len(rollout.per_call_rows(plain)) == 8
    assert [list(c.token_ids) for c in again.outputs] == [list(c.token_ids) for c in out.outputs]


def test_families_are_contiguous_in_the_model_batch(engines):
    """Children start at their own </promise>, so with several parents the
    arrival order interleaves families (child 0 of each, then child 1 ...);
    with batch_order="family" (the default) the model runner's batch keeps
    each family together, and the outputs are unchanged."""
    from vllm_seqhooks.core.batch_order import family_of
    from tests.support.forkjoin import model_runner_of

    hooked, stock, S = engines
    runner = model_runner_of(hooked)
    seen: list[tuple[list[str], list[str]]] = []

    def record(scheduler_output, _cls=type(runner)):
        before = list(runner.input_batch.req_ids[: runner.input_batch.num_reqs])
        _cls._may_reorder_batch(runner, scheduler_output)
        seen.append((before, list(runner.input_batch.req_ids[: runner.input_batch.num_reqs])))

    script = "a<promise>x</promise>b<promise>y</promise>c<promise>z</promise><sync>e"
    children = {"0": "A" * 12, "1": "B" * 12, "2": "C" * 12}
    runner._may_reorder_batch = record
    try:
        outs = gen(hooked, [f"family {i}: " for i in range(4)], S.params(script, children))
    finally:
        del runner._may_reorder_batch
    expected = S.text(S("a<promise>x</promise>b<promise>y</promise>c<promise>z</promise><sync>"
                        + "A" * 12 + "\n" + "B" * 12 + "\n" + "C" * 12 + "e"))
    assert [o.outputs[0].text for o in outs] == [expected] * 4

    def grouped(ids):
        fams = [family_of(r) for r in ids]
        runs = [f for i, f in enumerate(fams) if i == 0 or fams[i - 1] != f]
        return len(runs) == len(set(runs))

    assert seen
    assert any(not grouped(before) for before, _ in seen), "no step was interleaved"
    assert all(grouped(after) for _, after in seen), [a for _, a in seen if not grouped(a)]
    assert all(sorted(b) == sorted(a) for b, a in seen)
    # the stock engine in the same process keeps vLLM's order
    assert model_runner_of(stock).__dict__.get("_seqhooks_family_grouping") in (None, False)
    assert type(model_runner_of(hooked).__dict__.get("_seqhooks_family_grouping")).__name__ \
        == "FamilyGrouping"
    assert_engine_idle(hooked)
