"""vllm_seqhooks.rollout on hand-made traces: who gave each output token
through nested joins, cut merges, re-tokenized merges and a format's end
text; the per-call rows' contexts and responses; positions after a splice
join. (End to end against the formats' own loops: test_formats_oracle.py.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_seqhooks import rollout
from vllm_seqhooks.core.join_plan import cut_pieces, layout_pieces
from vllm_seqhooks.core.trace import TRACE_KEY


def _output(prompt, response, trace, request_id="r"):
    completion = SimpleNamespace(token_ids=response, logprobs=None)
    return SimpleNamespace(request_id=request_id, prompt_token_ids=prompt,
                           outputs=[completion], kv_transfer_params={TRACE_KEY: trace})


def test_layout_pieces_follow_merged_layout():
    # start 2, then child a (3), separator 1 + header 1, child b failed (marker 2), suffix 2
    assert layout_pieces(2, [0, 1], [3, 2], ["a", None], separator=1, suffix=2) == [
        (None, 2), ("a", 3), (None, 6)]
    assert cut_pieces([(None, 2), ("a", 3), (None, 2)], 1, 4) == [(None, 1), ("a", 2)]


# Root: prompt [1, 2]; output 10 11 | 50 (inserted) 20 21 (child 0) 51 (inserted)
# 30 31 32 (child 1, whose own output holds its child's 40 at index 1 and an
# end text 52 the engine added) | 12 (the root again).
CHILD_1 = {"key": "1", "output_token_ids": [30, 40, 52], "context_tokens": 3,
           "prompt_rest_token_ids": [51], "appended_tokens": 1, "dropped_token_ids": [],
           "joins": [{"at": 1, "merged_tokens": 1, "pieces": [["1.0", 1]], "children": ["1.0"]}],
           "children": [{"key": "1.0", "output_token_ids": [40], "context_tokens": 5,
                         "prompt_rest_token_ids": [], "dropped_token_ids": [2],
                         "joins": [], "children": []}]}
TRACE = {"key": "", "joins": [{
    "at": 2, "merged_tokens": 7, "children": ["0", "1"],
    "pieces": [[None, 1], ["0", 2], [None, 1], ["1", 3]]}],
    "children": [{"key": "0", "output_token_ids": [20, 21], "context_tokens": 4,
                  "prompt_rest_token_ids": [50], "dropped_token_ids": [2],
                  "joins": [], "children": []}, CHILD_1]}
RESPONSE = [10, 11, 50, 20, 21, 51, 30, 40, 52, 12]


def test_training_rows_say_who_sampled_each_token():
    (row,) = rollout.training_rows(_output([1, 2], RESPONSE, TRACE))
    assert row["response_mask"] == [1, 1, 0, 1, 1, 0, 1, 1, 0, 1]
    assert row["node_ids"] == ["", "", "", "0", "0", "", "1", "1.0", "1", ""]
    assert row["position_ids"] == list(range(12))
    assert row["rollout_logprobs"] is None


def test_a_text_merge_counts_as_inserted():
    trace = {**TRACE, "joins": [{**TRACE["joins"][0], "pieces": None}]}
    (row,) = rollout.training_rows(_output([1, 2], RESPONSE, trace))
    assert row["response_mask"] == [1, 1, 0, 0, 0, 0, 0, 0, 0, 1]


def test_a_cut_merge_keeps_what_fits():
    trace = {**TRACE, "joins": [{**TRACE["joins"][0], "merged_tokens": 4}]}
    (row,) = rollout.training_rows(_output([1, 2], RESPONSE[:6], trace))
    assert row["node_ids"] == ["", "", "", "0", "0", ""]


def test_per_call_rows_rebuild_each_nodes_context():
    rows = rollout.per_call_rows(_output([1, 2], RESPONSE, TRACE))
    got = [(r["node_id"], r["context_ids"], r["response_ids"], r["is_last"]) for r in rows]
    assert got == [
        ("", [1, 2], [10, 11], False),
        ("0", [1, 2, 10, 11, 50], [20, 21, 2], False),
        ("1", [1, 2, 10, 51], [30], False),  # the end text 52 is not its own
        ("1.0", [1, 2, 10, 51, 30], [40, 2], False),
        ("", [1, 2, 10, 11, 50, 20, 21, 51, 30, 40, 52], [12], True),
    ]  # in a client loop's order: a stretch, the children joined after it, the next
    assert {r["base_id"] for r in rows} == {"r"}
    assert all(r["rollout_logprobs"] is None for r in rows)  # (not asked)


def test_per_call_rows_carry_each_nodes_logprobs():
    """The root's from the output's rows, a child's from its trace node
    (what it sampled, then the tokens its output left out, such as its
    EOS); an inserted token of the root has no call row."""
    import copy

    trace = copy.deepcopy(TRACE)
    zero, one = trace["children"]
    zero["output_logprobs"] = [-0.2, -0.21, -0.22]  # 20 21, then its EOS
    one["output_logprobs"] = [-0.3, 0.0]  # 30, then its child's 40 (inserted: 0.0)
    one["children"][0]["output_logprobs"] = [-0.4, -0.41]
    out = _output([1, 2], RESPONSE, trace)
    out.outputs[0].logprobs = [{t: SimpleNamespace(logprob=-t / 100)} for t in RESPONSE]
    rows = rollout.per_call_rows(out)
    assert [(r["node_id"], r["rollout_logprobs"]) for r in rows] == [
        ("", [-0.1, -0.11]), ("0", [-0.2, -0.21, -0.22]), ("1", [-0.3]),
        ("1.0", [-0.4, -0.41]), ("", [-0.12])]
    (row,) = rollout.training_rows(out)
    assert row["rollout_logprobs"][:4] == [-0.1, -0.11, None, -0.2]


def test_splice_positions():
    # Prompt 3 tokens, the root writes 2 (its fork tag last), two paths of 3
    # and 2 tokens spliced from index 5, then 2 more.
    trace = {"key": "", "joins": [{"at": 2, "merged_tokens": 5, "children": ["0", "1"],
                                   "splice_paths": [3, 2],
                                   "pieces": [[None, 1], ["0", 2], [None, 1], ["1", 1]]}],
             "children": [{"key": k, "output_token_ids": [9] * n, "joins": [], "children": []}
                          for k, n in (("0", 2), ("1", 1))]}
    (row,) = rollout.training_rows(_output([1, 2, 3], [7, 8, 4, 9, 9, 5, 9, 6, 6], trace))
    assert row["position_ids"] == [0, 1, 2, 3, 4, 5, 6, 7, 5, 6, 8, 9]


def test_each_of_n_completions_gets_its_own_rows():
    """With ``n`` > 1 every completion is its own family: its own trace
    (kv_transfer_params["seqhooks_traces"], in output order), its rows and
    base id; a completion without hooks has plain rows."""
    from vllm_seqhooks.core.trace import TRACES_KEY, completion_traces, with_completion_traces

    params = with_completion_traces({"other": 1, TRACE_KEY: "last finished"}, [None, TRACE])
    assert params == {"other": 1, TRACES_KEY: [None, TRACE]}  # (the first had no hook)
    out = _output([1, 2], [5, 6], None, request_id="req")
    out.outputs = [SimpleNamespace(index=0, token_ids=[5, 6], logprobs=None),
                   SimpleNamespace(index=1, token_ids=RESPONSE, logprobs=None)]
    out.kv_transfer_params = params
    assert completion_traces(out) == [None, TRACE]
    plain, hooked = rollout.training_rows(out)
    assert plain["response_mask"] == [1, 1] and plain["node_ids"] == ["", ""]
    (alone,) = rollout.training_rows(_output([1, 2], RESPONSE, TRACE))
    assert hooked == alone
    calls = rollout.per_call_rows(out)
    assert {r["base_id"] for r in calls} == {"0_req", "1_req"}
    assert [r for r in calls if r["completion_index"] == 1] == [
        dict(r, base_id="1_req", completion_index=1)
        for r in rollout.per_call_rows(_output([1, 2], RESPONSE, TRACE))]
    assert all(r["base_id"] == "0_req" for r in calls if r["completion_index"] == 0)
    assert [r["is_last"] for r in calls if r["node_id"] == ""] == [True, False, True]
    # a single trace for several samples: the per-sample traces were not collected
    out.kv_transfer_params = {TRACE_KEY: TRACE}
    with pytest.raises(ValueError, match="not collected"):
        rollout.training_rows(out)


PLAIN = [7, 8, 9]


def _group(forked: list[bool], openai: bool):
    """An ``n = len(forked)`` group as the engine's frontend answers it:
    sample i forked (TRACE, RESPONSE) or not (PLAIN, no trace), the traces
    collected as the frontend patch does (``with_completion_traces``: no
    list at all when no sample forked)."""
    from vllm_seqhooks.core.trace import with_completion_traces

    traces = [TRACE if f else None for f in forked]
    params = {TRACE_KEY: traces[-1]} if traces[-1] is not None else None
    params = with_completion_traces(params, traces)
    responses = [RESPONSE if f else PLAIN for f in forked]
    if openai:  # an OpenAI completion response (asked with return_token_ids), as JSON
        return {"id": "cmpl-1", "kv_transfer_params": params, "choices": [
            {"index": i, "token_ids": r, "prompt_token_ids": [1, 2], "logprobs": None}
            for i, r in enumerate(responses)]}
    return SimpleNamespace(
        request_id="r", prompt_token_ids=[1, 2], kv_transfer_params=params,
        outputs=[SimpleNamespace(index=i, token_ids=r, logprobs=None)
                 for i, r in enumerate(responses)])


@pytest.mark.parametrize("openai", [False, True], ids=["RequestOutput", "openai"])
@pytest.mark.parametrize("forked", [
    [True], [False], [True] * 8, [False] * 8, [False, True, False, False, True, False, False, False],
    [True, False, False, False, False, False, False, False]],
    ids=["n1-forked", "n1-plain", "n8-all", "n8-none", "n8-some", "n8-first"])
def test_rows_for_any_mix_of_forked_and_plain_samples(forked, openai):
    """GRPO groups in which no sample, some or all forked (short problems
    never fork): every sample has its rows, a plain one all sampled by the
    root, a forked one as if it were alone."""
    out = _group(forked, openai)
    rows = rollout.training_rows(out)
    calls = rollout.per_call_rows(out)
    (alone,) = rollout.training_rows(_output([1, 2], RESPONSE, TRACE))
    alone_calls = [dict(c, base_id="", completion_index=0)
                   for c in rollout.per_call_rows(_output([1, 2], RESPONSE, TRACE))]
    assert len(rows) == len(forked)
    for i, (row, f) in enumerate(zip(rows, forked)):
        if f:
            assert row == alone
        else:
            assert row["response_ids"] == PLAIN
            assert row["response_mask"] == [1, 1, 1] and row["node_ids"] == ["", "", ""]
            assert row["position_ids"] == list(range(5))
        mine = [c for c in calls if c["completion_index"] == i]
        assert [dict(c, base_id="", completion_index=0) for c in mine] == (
            alone_calls if f else
            [{"node_id": "", "base_id": "", "context_ids": [1, 2], "response_ids": PLAIN,
              "is_last": True, "rollout_logprobs": None, "completion_index": 0}])
    assert len({c["base_id"] for c in calls}) == len(forked)


def test_several_prompts_in_one_openai_response_are_refused_by_name():
    out = _group([True, False], openai=True)
    out["choices"][1]["prompt_token_ids"] = [1, 3]
    with pytest.raises(ValueError, match="2 different prompts"):
        rollout.training_rows(out)
