"""Aborts and KV-cache pressure, driving the in-process engine step by step.

The two engines run torch on one thread (``one_torch_thread``): the KV
pressure test's few hundred steps took 27-49 s on a busy machine with two
spinning OpenMP threads and about 1 s on one; aborts, spills and
preemptions are the scheduler's and do not depend on it."""

from __future__ import annotations

import pytest

from vllm_seqhooks.scripted.tiny_model import EOS_ID

pytestmark = pytest.mark.slow

BLOCK = 32
#: KV bytes per block of the tiny model: 2 layers x (K, V) x 1 head x 64 x fp32.
BLOCK_BYTES = 2 * 2 * 1 * 64 * 4 * BLOCK


@pytest.fixture(scope="module")
def llms(tiny_model_dir):
    from tests.support.forkjoin import Scripts, hook_llm
    from tests.support.torch_threads import one_torch_thread

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        roomy = hook_llm(tiny_model_dir, max_model_len=512,
                         hooks=dict(failed_child_marker="[x]"))
        # 40 blocks: a couple of families at a time, far from all 32.
        tight = hook_llm(tiny_model_dir, max_model_len=512,
                         kv_cache_memory_bytes=40 * BLOCK_BYTES, max_num_seqs=16)
        with one_torch_thread():
            yield roomy, tight, Scripts(roomy.get_tokenizer())


def idle(llm):
    from tests.support.forkjoin import kv_blocks_in_use, scheduler_of

    sched = scheduler_of(llm)
    sizes = sched.hook_state_sizes()
    return (sizes == {k: 0 for k in sizes} and kv_blocks_in_use(llm) == 0
            and not sched.requests and sched.num_waiting_for_streaming_input == 0)


def step_until(llm, cond, max_steps=2000):
    eng = llm.llm_engine
    outputs = []
    for _ in range(max_steps):
        if cond():
            return outputs
        outputs.extend(eng.step())
    raise AssertionError("condition not reached within the step bound")


def drain(llm, max_steps=5000):
    eng = llm.llm_engine
    outs = []
    for _ in range(max_steps):
        if not eng.has_unfinished_requests():
            return outs
        outs.extend(eng.step())
    raise AssertionError("engine did not drain (deadlock?)")


def long_child_params(S, script):
    # children run free (no script) for up to 300 tokens: long enough to abort
    return S.params(script, None, child_end=None,
                    extra_args={"seqhooks_child_max_tokens": 300})


def test_abort_parent_while_blocked(llms):
    from tests.support.forkjoin import scheduler_of

    roomy, _, S = llms
    sched = scheduler_of(roomy)
    roomy.llm_engine.add_request("blocked", "hello", long_child_params(
        S, "<promise>a</promise><promise>b</promise><sync>after"))
    step_until(roomy, lambda: sched.hook_state_sizes()["parked"] == 1)
    assert len(sched.fork_join.children) == 2
    roomy.llm_engine.abort_request(["blocked"])
    drain(roomy)
    assert idle(roomy)
    assert sched.hook_stats["children_aborted"] >= 2


def test_abort_parent_while_children_run(llms):
    from tests.support.forkjoin import scheduler_of

    roomy, _, S = llms
    sched = scheduler_of(roomy)
    roomy.llm_engine.add_request("running", "hello", long_child_params(
        S, "<promise>a</promise>" + "z" * 200))
    step_until(roomy, lambda: len(sched.fork_join.children) == 1)
    step_until(roomy, lambda: any(r.num_output_tokens > 3 for r in sched.fork_join.children.values()))
    roomy.llm_engine.abort_request(["running"])
    drain(roomy)
    assert idle(roomy)


def test_aborted_child_never_blocks_its_parent(llms):
    from tests.support.forkjoin import engine_core_of, scheduler_of

    roomy, _, S = llms
    sched = scheduler_of(roomy)
    # child "1" has no script and runs free for 300 tokens; we abort it.
    params = S.params("<promise>a</promise><promise>b</promise><sync>end", {"0": "AAA"},
                      extra_args={"seqhooks_child_max_tokens": 300})
    roomy.llm_engine.add_request("victim-parent", "hello", params)
    step_until(roomy, lambda: sched.hook_state_sizes()["parked"] == 1)
    (child1,) = [r for r in sched.fork_join.children if r.endswith("child1")]
    engine_core_of(roomy).abort_requests([child1])
    outs = drain(roomy)
    final = [o for o in outs if o.finished]
    assert len(final) == 1
    # the aborted child contributes the configured marker
    assert final[0].outputs[0].text.endswith("<sync>AAA\n[x]end")
    assert idle(roomy)


def test_sync_limit_reached_aborted_family_leaves_nothing(llms):
    """Aborting many families at once frees every block."""
    roomy, _, S = llms
    for i in range(8):
        roomy.llm_engine.add_request(f"fam{i}", f"hi {i}", long_child_params(
            S, "<promise>a</promise><promise>b</promise><sync>c"))
    for _ in range(12):
        roomy.llm_engine.step()
    roomy.llm_engine.abort_request([f"fam{i}" for i in range(8)])
    drain(roomy)
    assert idle(roomy)


def family_params(S, i):
    children = {str(j): f"c{i}.{j}" * 6 for j in range(4)}
    promises = "".join(f"<promise>p{j}</promise>" for j in range(4))
    return S.params(f"s{i}" + promises + "<sync>t", children)


def test_kv_pressure_all_families_finish_identically(llms):
    """32 parents x 4 children with a KV cache that holds a few families:
    every request finishes, with the same text as without pressure, and
    nothing is left allocated."""
    from tests.support.forkjoin import scheduler_of

    roomy, tight, S = llms
    prompts = [("Family %d " % i) * 12 for i in range(32)]  # ~120 tokens each
    params = [family_params(S, i) for i in range(32)]
    want = [o.outputs[0].text for o in roomy.generate(prompts, params, use_tqdm=False)]
    sched = scheduler_of(tight)
    total_blocks = sched.kv_cache_manager.block_pool.num_gpu_blocks
    assert total_blocks < 64, total_blocks  # really too small for 32 families
    got = tight.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].text for o in got] == want
    assert all(o.outputs[0].finish_reason == "stop" for o in got)
    assert idle(tight)
    # the pressure was real: vLLM preempted or we spilled parked parents
    assert sched.hook_stats["spills"] + sched.hook_stats["preemptions"] > 0


def test_eos_stop_token_not_in_text(llms):
    roomy, _, S = llms
    out = roomy.generate(["x"], S.params("<promise>q</promise><sync>", {"0": "Z"}),
                         use_tqdm=False)[0].outputs[0]
    assert out.text == "<promise>q</promise><sync>Z"
    assert out.token_ids[-1] == EOS_ID
