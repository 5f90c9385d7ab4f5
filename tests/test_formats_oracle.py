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

    from vllm_seqhooks.testing.forkjoin import scripted_engine_kwargs

    return vllm.LLM(tiny_model_dir, **scripted_engine_kwargs(tiny_model_dir))


@pytest.fixture(scope="module", params=list(CASES))
def native(request, in_process, tiny_model_dir):
    from vllm_seqhooks.llm import LLM
    from vllm_seqhooks.testing.forkjoin import scripted_engine_kwargs

    # Children without their end tag here: every parent goes on after them.
    spec = {"format": request.param, "max_child_depth": 1, "fork_min_tokens": None,
            "child_max_tokens": 20, "unclosed_child_stop_text": None}
    llm = LLM(tiny_model_dir, special_kwargs=spec, **scripted_engine_kwargs(tiny_model_dir))
    yield request.param, spec, llm
    del llm
    gc.collect()


def test_native_equals_the_formats_own_loop(native, stock):
    from vllm_seqhooks.loops.format_loop import FormatLoop
    from vllm_seqhooks.testing.forkjoin import Scripts, scheduler_of

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

    with pytest.raises(SpecialKwargsError, match="fork_tag '</Outlinés>' cannot be written"):
        LLM(tiny_model_dir, special_kwargs={"format": "threadweaver", "fork_tag": "</Outlinés>"})


def test_promise_preset_equals_its_client_loop(tiny_model_dir, in_process, stock):
    """The fifth preset, ``promise``, against the project's client loop
    (benchmarks.loop.ScriptedClientLoop: ClientLoop replaying scripts)."""
    from benchmarks.loop import ScriptedClientLoop
    from vllm_seqhooks.llm import LLM
    from vllm_seqhooks.testing.forkjoin import Scripts, scripted_engine_kwargs

    spec = {"format": "promise", "merge_separator": ","}
    llm = LLM(tiny_model_dir, special_kwargs=spec, **scripted_engine_kwargs(tiny_model_dir))
    S = Scripts(llm.get_tokenizer())
    params = S.params("ab<promise>xy</promise><promise>zw</promise>c<sync>done",
                      {"0": "AAA", "1": "BBBB"}, max_tokens=80)
    prompts = ["Q: one", "Q: two"]
    outs = llm.generate(prompts, params, use_tqdm=False)
    results = ScriptedClientLoop(stock, spec).generate(prompts, params)
    for out, res in zip(outs, results):
        assert S.text(out.outputs[0].token_ids) == (
            "ab<promise>xy</promise><promise>zw</promise>c<sync>AAA,BBBBdone</s>")
        assert list(out.outputs[0].token_ids) == res.token_ids
    del llm
    gc.collect()
