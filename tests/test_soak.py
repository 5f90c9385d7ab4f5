"""Soak: 10,000 fork/join cycles in one engine, in waves; after every wave
the scheduler's fork/join state, its requests and the KV blocks in use are
back to zero (no growth)."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.slow

WAVES, PARENTS, CYCLES = 20, 50, 10  # 10,000 cycles


def test_ten_thousand_fork_join_cycles(tiny_model_dir):
    from tests.support.forkjoin import Scripts, hook_llm, kv_blocks_in_use, scheduler_of

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        llm = hook_llm(tiny_model_dir, max_num_seqs=256)
    S = Scripts(llm.get_tokenizer())
    sched = scheduler_of(llm)
    script = "<promise>a</promise><sync>" * CYCLES + "."
    expected = "<promise>a</promise><sync>b" * CYCLES + "."
    params = S.params(script, None, child_end="eos",
                      extra_args={"seqhooks_child_default_script": S("b")})
    start_stats = dict(sched.hook_stats)
    t0 = time.perf_counter()
    for wave in range(WAVES):
        outs = llm.generate([f"wave {wave} parent {i}" for i in range(PARENTS)],
                            params, use_tqdm=False)
        assert [o.outputs[0].text for o in outs] == [expected] * PARENTS
        assert all(len(o.hook_trace["joins"]) == CYCLES for o in outs)
        sizes = sched.hook_state_sizes()
        assert sizes == {k: 0 for k in sizes}, (wave, sizes)
        assert not sched.requests and kv_blocks_in_use(llm) == 0
        assert sched.num_waiting_for_streaming_input == 0
    elapsed = time.perf_counter() - t0
    joins = sched.hook_stats["joins"] - start_stats["joins"]
    spawned = sched.hook_stats["children_spawned"] - start_stats["children_spawned"]
    assert joins == spawned == WAVES * PARENTS * CYCLES
    print(f"\nsoak: {joins} fork/join cycles in {elapsed:.1f}s "
          f"({joins / elapsed:.0f} cycles/s)")
