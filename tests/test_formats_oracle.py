"""Each preset through ``vllm_seqhooks.LLM`` against its own inference loop
over stock vLLM (:class:`~vllm_seqhooks.loops.format_loop.FormatLoop`): the same
tokens, greedy, on the tiny model with scripted tokens (every tag is several
tokens of its character tokenizer)."""

from __future__ import annotations

import gc

import pytest

pytestmark = pytest.mark.slow

CASES = {
    "threadweaver": (
        "<Parallel>\n<Outlines>\n<Outline>1: a</Outline>\n<Outline>2: b</Outline>\n"
        "<Outline>3: c</Outline>\n</Outlines>",
        {"0": " alpha</Thread>", "1": " beta", "2": " gamma is long and longer still"},
        "</Parallel> 42",
        "\n<Thread>\n1: alpha</Thread><Thread>\n2: beta\n</Thread><Thread>\n3: gamma is long and l\n</Thread>"
        "\n<Conclusion>\n",
    ),
    "multiverse": (
        "<Parallel>\n<Goal>\n<Outline>\n1: x\n</Outline>\n<Outline>\n2: y\n</Outline>\n</Goal>",
        {"0": " p\n</Path>", "1": " q"},
        "done",
        "\n<Path>\n1: p\n</Path>\n<Path>\n2: q\n<Conclusion>\n",
    ),
    "npr": (
        "<guideline>\n<plan>1: x</plan>\n<plan>2: y</plan>\n</guideline>",
        {"0": " p\n</step>", "1": " q</step>"},
        "done",
        "\n<step>\n1: p\n</step>\n<step>\n2: q</step>\n<takeaway>\n",
    ),
    "parallel-r1": (
        "Let me think.<Parallel>",
        {"0": "A</Path>", "1": "B"},
        "both agree</Summary>",
        "<Path>A</Path><Path>B</Path></Parallel>\n<Summary>",
    ),
}


@pytest.fixture(scope="module")
def in_process():
    """Engines in this process (their schedulers are readable), for the whole
    module: set up before and restored after every engine fixture."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        yield


@pytest.fixture(scope="module")
def stock(in_process, tiny_model_dir):
    import vllm

    from tests.support.forkjoin import scripted_engine_kwargs

    return vllm.LLM(tiny_model_dir, **scripted_engine_kwargs(tiny_model_dir))


@pytest.fixture(scope="module", params=list(CASES))
def native(request, in_process, tiny_model_dir):
    from vllm_seqhooks.llm import LLM
    from tests.support.forkjoin import scripted_engine_kwargs

    # Children without their end tag here: every parent goes on after them.
    spec = {"format": request.param, "max_child_depth": 1, "fork_min_tokens": None,
            "child_max_tokens": 20, "unclosed_child_stop_text": None}
    llm = LLM(tiny_model_dir, special_kwargs=spec, **scripted_engine_kwargs(tiny_model_dir))
    yield request.param, spec, llm
    del llm
    gc.collect()


def test_native_equals_the_formats_own_loop(native, stock):
    from vllm_seqhooks.loops.format_loop import FormatLoop
    from tests.support.forkjoin import Scripts, scheduler_of

    name, spec, llm = native
    before, children, after, merged = CASES[name]
    S = Scripts(llm.get_tokenizer())
    prompts = ["Q: one", "Q: two, longer prompt"]
    params = S.params(before + after, children, max_tokens=200)
    outs = llm.generate(prompts, params, use_tqdm=False)
    loop = FormatLoop(stock, spec)
    results = loop.generate(prompts, params)
    for out, res in zip(outs, results):
        comp = out.outputs[0]
        assert S.text(comp.token_ids) == before + merged + after + "</s>"
        assert list(comp.token_ids) == res.token_ids
        assert comp.finish_reason == res.finish_reason == "stop"
    assert loop.stats["child_calls"] == 1
    sched = scheduler_of(llm)
    sizes = sched.hook_state_sizes()
    assert sizes == {k: 0 for k in sizes}, sizes


def test_presets_by_name_with_llm(tiny_model_dir):
    """``special_kwargs="threadweaver"``: the preset's tags resolve through
    the model's tokenizer; a tag it cannot write fails before the engine
    starts."""
    from vllm_seqhooks.config.special_kwargs import SpecialKwargsError
    from vllm_seqhooks.llm import LLM

    with pytest.raises(SpecialKwargsError, match="fork_tag '</Résumé>' cannot be written"):
        LLM(tiny_model_dir, special_kwargs={"format": "threadweaver", "fork_tag": "</Résumé>"})


def test_promise_preset_equals_its_client_loop(tiny_model_dir, in_process, stock):
    """The fifth preset, ``promise``, against the project's client loop
    (ClientLoop: its requests carry the engine's keys, so the scripts
    replay), in each of its modes: lockstep rounds, events (requests sent
    between engine steps) and stream (children sent at their payload's end)."""
    from vllm_seqhooks.llm import LLM
    from vllm_seqhooks.loops.promise_loop import MODES, ClientLoop
    from tests.support.forkjoin import Scripts, scripted_engine_kwargs

    spec = {"format": "promise", "merge_separator": ","}
    llm = LLM(tiny_model_dir, special_kwargs=spec, **scripted_engine_kwargs(tiny_model_dir))
    S = Scripts(llm.get_tokenizer())
    params = S.params("ab<promise>xy</promise><promise>zw</promise>c<sync>done",
                      {"0": "AAA", "1": "BBBB"}, max_tokens=80)
    prompts = ["Q: one", "Q: two"]
    outs = llm.generate(prompts, params, use_tqdm=False)
    for out in outs:
        assert S.text(out.outputs[0].token_ids) == (
            "ab<promise>xy</promise><promise>zw</promise>c<sync>AAA,BBBBdone</s>")
    for mode in MODES:
        results = ClientLoop(stock, spec, mode=mode).generate(prompts, params)
        for out, res in zip(outs, results):
            assert list(out.outputs[0].token_ids) == res.token_ids, mode
            assert res.finish_reason == out.outputs[0].finish_reason, mode
            assert (res.rounds, len(res.children), len(res.joins)) == (2, 2, 1), mode
    # Training rows: each child's tokens under its node, the separator
    # inserted, the parent's own tokens (its EOS included) sampled.
    from vllm_seqhooks import rollout

    (row,) = rollout.training_rows(outs[0])
    by = lambda key, m: S.text([t for t, n, k in zip(  # noqa: E731
        row["response_ids"], row["node_ids"], row["response_mask"]) if n == key and k == m])
    assert (by("0", 1), by("1", 1), by("", 0)) == ("AAA", "BBBB", ",")
    assert by("", 1) == "ab<promise>xy</promise><promise>zw</promise>c<sync>done</s>"
    assert row["position_ids"] == list(range(len(row["prompt_ids"]) + len(row["response_ids"])))
    del llm
    gc.collect()


class _RecordingLLM:
    """A stock ``vllm.LLM`` that notes every sequence it was asked to
    continue and what it sampled: the calls of a client loop."""

    def __init__(self, llm) -> None:
        self.llm = llm
        self.calls: list[tuple[list[int], list[int]]] = []

    def __getattr__(self, name):
        return getattr(self.llm, name)

    def generate(self, prompts, params, **kwargs):
        outs = self.llm.generate(prompts, params, **kwargs)
        self.calls += [(list(o.prompt_token_ids), list(o.outputs[0].token_ids)) for o in outs]
        return outs


def test_rollout_rows_are_the_loops_own_calls(native, stock):
    """``vllm_seqhooks.rollout`` on a native output against the format's
    loop over stock vLLM (ThreadWeaver's agent loop makes one training row
    per engine call: the exact tokens the call was given, what it
    sampled): ``per_call_rows`` gives those rows; ``training_rows`` masks
    exactly the tokens some call sampled, each under the node whose call
    sampled it, and leaves the inserted ones out."""
    from vllm_seqhooks import rollout
    from vllm_seqhooks.loops.format_loop import FormatLoop
    from tests.support.forkjoin import Scripts

    name, spec, llm = native
    before, children, after, _ = CASES[name]
    S = Scripts(llm.get_tokenizer())
    params = S.params(before + after, children, max_tokens=200)
    (out,) = llm.generate(["Q: one"], params, use_tqdm=False)
    recorder = _RecordingLLM(stock)
    FormatLoop(recorder, spec).generate(["Q: one"], params)
    rows = rollout.per_call_rows(out)
    assert sorted((r["context_ids"], r["response_ids"]) for r in rows) == sorted(recorder.calls)
    assert [r["is_last"] for r in rows if r["node_id"] == ""][-1] is True
    (row,) = rollout.training_rows(out)
    assert row["prompt_ids"] == list(out.prompt_token_ids)
    assert row["response_ids"] == list(out.outputs[0].token_ids)
    assert len(row["position_ids"]) == len(row["prompt_ids"]) + len(row["response_ids"])
    from vllm_seqhooks.core.trace import iter_nodes, raw_trace

    trace = raw_trace(out)
    dropped = {n["key"]: n.get("dropped_token_ids", []) for n in iter_nodes(trace)}
    inserted = [t for t, m in zip(row["response_ids"], row["response_mask"]) if not m]
    assert inserted  # headers, separators, suffix
    (join,) = trace["joins"]
    total = len(row["position_ids"])
    if join["mode"] == "splice":  # paths side by side from the fork point's position
        from vllm_seqhooks.core.splice_layout import Parallel, positions

        context = len(row["prompt_ids"]) + join["at"]
        paths = join["splice_paths"]
        layout = (context, Parallel(tuple((n,) for n in paths)), total - context - sum(paths))
        assert row["position_ids"] == positions(layout)
        assert row["position_ids"][-1] == total - 1 - sum(paths) + max(paths)
    else:
        assert row["position_ids"] == list(range(total))
    for node in {r["node_id"] for r in rows}:
        sampled = [t for t, m, n in zip(row["response_ids"], row["response_mask"],
                                        row["node_ids"]) if m and n == node]
        calls = [t for r in rows if r["node_id"] == node for t in r["response_ids"]]
        if node and spec_format_merges_text(spec):
            assert sampled == [], node  # re-tokenized: no token-by-token owner
        else:
            assert sampled + dropped.get(node, []) == calls, node


def spec_format_merges_text(spec) -> bool:
    from vllm_seqhooks.config.presets import expand

    return expand(spec).get("boundary_tokenization") == "text"
