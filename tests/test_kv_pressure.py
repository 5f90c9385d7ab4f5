"""Under a tight KV cache native fork/join takes no more engine steps than
the client loop over stock vLLM, and computes fewer tokens.

The benchmark's memory workload (``python -m benchmarks --quick --workloads
memory``), run here once at its tight point: 16 families (256-token prompts,
4 promises, 32-token children, a 16-token continuation) on an 81-block cache
where about five families fit at once. Both engines get the same scripted
tokens, cache size and batch limits; steps are counted by the benchmark's
probe (a step is a ``schedule()`` that scheduled tokens), so nothing here
depends on the machine's speed.

Why native keeps up: children wait family by family (siblings run together
and share their parent's context once), parked parents give their blocks
back when the next waiting request cannot get blocks (as the loop frees a
parent's blocks at every round, but only under pressure), and fair share
does not hold a family back for a request that even a fair share of the
cache could not hold.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

TIGHT_BLOCKS = 81


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        mp.setenv("TOKENIZERS_PARALLELISM", "false")
        from benchmarks.__main__ import profiles
        from benchmarks.common import Bench, bench_model
        from benchmarks.forkjoin import warm_up

        profile = profiles()["quick"]
        profile.model = bench_model(profile.size, profile.dtype,
                                    tmp_path_factory.mktemp("bench-models"))
        b = Bench(profile, log=lambda _: None)
        kv_tokens = (TIGHT_BLOCKS + 1) * profile.block_size
        b.engine("native_tight", "hooks", kv_tokens=kv_tokens, scripted=True, max_model_len=512)
        b.engine("stock_tight", "stock", kv_tokens=kv_tokens, scripted=True, max_model_len=512)
        b.probe("native_tight", track_parked=True)
        b.probe("stock_tight")
        warm_up(b, ("native_tight", "stock_tight"))
        try:
            yield b
        finally:
            b.close_all()


def test_tight_kv_native_takes_no_more_steps_than_the_loop(bench):
    from benchmarks.forkjoin import families, run_one

    names = ("native_tight", "stock_tight")
    assert bench.probes["native_tight"].num_blocks == TIGHT_BLOCKS
    point = dict(bench.profile.settings["memory"]["point"])
    sep = list(bench.engines["native_tight"].special_kwargs.merge_separator_token_ids)
    fams = families(point, 200, sep)
    native = run_one(bench, "native", fams, engine_names=names)
    loop = run_one(bench, "loop", fams, engine_names=names)
    assert native["correct"] and loop["correct"]
    # The cache was tight for both: parents spilled, requests preempted.
    assert native["spills"] > 0 and loop["preemptions"] > 0
    assert native["steps"] <= loop["steps"], (native["steps"], loop["steps"])
    assert native["computed_tokens"] < loop["computed_tokens"]
    sched = bench.probes["native_tight"].sched
    sizes = sched.hook_state_sizes()
    assert sizes == {k: 0 for k in sizes}, sizes
    assert sched.kv_cache_manager.usage == 0
