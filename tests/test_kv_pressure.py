"""Under a tight KV cache native fork/join takes no more engine steps than
the client loop over stock vLLM, and computes fewer tokens.

The benchmark's memory workload (``python -m benchmarks --quick|--full
--workloads memory``), run here once at each tight point: 16 families
(256-token prompts, 4 promises, 32-token children, on 81 blocks; 1,024-token
prompts and 64-token children on 216 blocks), about five of which fit at
once. Both engines get the same scripted
tokens, cache size and batch limits; steps are counted by the benchmark's
probe (a step is a ``schedule()`` that scheduled tokens), so nothing here
depends on the machine's speed.

Why native keeps up: children wait family by family (siblings run together
and share their parent's context once), parked parents give their blocks
back when the next waiting request cannot get blocks (as the loop frees a
parent's blocks at every round, but only under pressure), vLLM's preemption
takes the newest family first and whole, and fair share does not hold a
family back for a request that even a fair share of the cache could not
hold.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

#: The benchmark's tight points: its quick one (81 blocks, 30 % of native's
#: peak) and its full one (L1024 k4 m64, 216 blocks), both on the tiny model
#: (the scripted tokens, and so the steps, do not depend on the model).
POINTS = {
    "quick": dict(profile="quick", blocks=81, max_model_len=512),
    "full": dict(profile="full", blocks=216, max_model_len=1536),
}


@pytest.fixture(scope="module")
def in_process():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        mp.setenv("TOKENIZERS_PARALLELISM", "false")
        yield


@pytest.fixture(scope="module")
def model(in_process, tmp_path_factory):
    from benchmarks.common import bench_model

    return bench_model("tiny", "float32", tmp_path_factory.mktemp("bench-models"))


@pytest.fixture(scope="module", params=list(POINTS))
def tight(request, model):
    from benchmarks.__main__ import profiles
    from benchmarks.common import Bench
    from benchmarks.forkjoin import warm_up

    spec = POINTS[request.param]
    profile = profiles()["quick"]
    profile.model = model
    point = dict(profiles()[spec["profile"]].settings["memory"]["point"])
    b = Bench(profile, log=lambda _: None)
    kv_tokens = (spec["blocks"] + 1) * profile.block_size
    for name, kind in (("native_tight", "hooks"), ("stock_tight", "stock")):
        b.engine(name, kind, kv_tokens=kv_tokens, scripted=True,
                 max_model_len=spec["max_model_len"])
    b.probe("native_tight", track_parked=True)
    b.probe("stock_tight")
    warm_up(b, ("native_tight", "stock_tight"))
    try:
        yield b, point, spec["blocks"]
    finally:
        b.close_all()


def test_tight_kv_native_takes_no_more_steps_than_the_loop(tight):
    from benchmarks.forkjoin import families, run_one

    bench, point, blocks = tight
    names = ("native_tight", "stock_tight")
    assert bench.probes["native_tight"].num_blocks == blocks
    sep = list(bench.engines["native_tight"].special_kwargs.merge_separator_token_ids)
    fams = families(point, 200, sep)
    native = run_one(bench, "native", fams, engine_names=names)
    loop = run_one(bench, "loop", fams, engine_names=names)
    assert native["correct"] and loop["correct"]
    # The cache was tight: parked parents spilled.
    assert native["spills"] > 0
    assert native["steps"] <= loop["steps"], (native["steps"], loop["steps"])
    assert native["computed_tokens"] < loop["computed_tokens"]
    sched = bench.probes["native_tight"].sched
    sizes = sched.hook_state_sizes()
    assert sizes == {k: 0 for k in sizes}, sizes
    assert sched.kv_cache_manager.usage == 0
