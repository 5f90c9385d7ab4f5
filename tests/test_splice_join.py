"""Splice joins end to end (join='splice', issue 21): on random
Multiverse-format families (1-4 paths of unequal length, prompts of 3-90
tokens so that forks and paths fall anywhere in a block, children ending
at their end tag or at EOS), the parent's tokens after the join equal a
transformers forward with path-isolated attention and shared positions
(testing/splice_oracle.py), in every engine mode, with block sizes 32
and 64 (the CPU backend takes multiples of 32) and with prefix caching
off; the join prefills only the format's suffix; nothing is left behind. Control: a re-prefill join of the same families
continues differently wherever the paths are more than one.

Each run is one engine; a mode's runs share its process (``RUNS``; the
modes' processes at once, ``ModeProcesses``), the oracle runs in pytest's
process on one thread. About a minute on 2 cores (67 s under a load of 5):
the V1-sync process, nine engines, is the longest path; the other core
runs V1-async's two and V2-async's one meanwhile."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import splice_families
from tests.support.engine_modes import IN_PROCESS, MODES, EngineMode, ModeProcesses

pytestmark = pytest.mark.slow

FAMILIES = 9
#: The V1 runner at block sizes 32 and 64 (sync scheduling) and 32 (async);
#: the V2 runner with async scheduling, vLLM's GPU default (it runs through
#: Triton's interpreter, slowly). V2 with sync scheduling is left out to keep
#: CI short: its runner side is V2-async's, its scheduler side V1-sync's.
#: 4 runs, 36 families.
ORACLE_RUNS = [(MODES[0], 32), (MODES[0], 64), (MODES[1], 32), (MODES[3], 32)]
#: KV cache of the spill runs, in tokens (9 families of up to ~600 tokens each).
SPILL_KV_TOKENS = 1400

#: Every engine run of the module: its name, its engine mode and the
#: arguments of :func:`tests.support.splice_families.run_families`
#: (``kv_tokens``: the KV cache's size in tokens of the tiny model).
RUNS: dict[str, tuple[EngineMode, dict]] = {
    **{f"{m.id}-{b}": (m, dict(seed=b + MODES.index(m), block_size=b)) for m, b in ORACLE_RUNS},
    "no-prefix-cache": (MODES[0], dict(seed=7, enable_prefix_caching=False)),
    "reprefill": (MODES[0], dict(seed=3, join="reprefill")),
    "nested": (MODES[0], dict(seed=5, nested=True, free=160)),
    **{f"twice-{cache}": (MODES[0], dict(seed=11, twice=True, free=40,
                                         enable_prefix_caching=cache == "prefix_cache"))
       for cache in ("prefix_cache", "no_prefix_cache")},
    **{f"spills-{m.id}": (m, dict(seed=17, kv_tokens=SPILL_KV_TOKENS)) for m in MODES[:2]},
    "chunked": (MODES[0], dict(seed=13, max_num_batched_tokens=40)),
}


def _run_kwargs(kwargs: dict, kv_bytes_per_token: int) -> dict:
    kwargs = dict(kwargs, families=FAMILIES)
    if "kv_tokens" in kwargs:
        kwargs["kv_cache_memory_bytes"] = kwargs.pop("kv_tokens") * kv_bytes_per_token
    return kwargs


@pytest.fixture(scope="module")
def runs(tiny_model_dir):
    """Name -> run, of :data:`RUNS`: each mode's runs one engine after
    another in one process (an in-process engine starts in about a second,
    a process imports vLLM in about 12; the session's process of each mode,
    :mod:`tests.support.mode_workers`), the modes' processes at once."""
    from benchmarks.common import kv_bytes_per_token

    per_token = kv_bytes_per_token(Path(tiny_model_dir), "float32")
    modes = dict.fromkeys(m for m, _ in RUNS.values())
    processes = ModeProcesses({mode: ("tests.support.splice_families:run_many", dict(
        model=tiny_model_dir, runs={name: _run_kwargs(kwargs, per_token)
                                    for name, (m, kwargs) in RUNS.items() if m == mode}))
        for mode in modes}, env=IN_PROCESS)
    yield lambda name: processes.result(RUNS[name][0])[name]
    processes.close()


def _assert_clean(run: dict) -> None:
    assert run["idle"]
    assert not any(run["sizes"].values()), run["sizes"]


@pytest.mark.parametrize("name", [f"{m.id}-{b}" for m, b in ORACLE_RUNS])
def test_splice_join_equals_the_oracle(name, runs, tiny_model_dir):
    run = runs(name)
    _assert_clean(run)
    suffix = len(run["suffix"])
    assert run["stats"]["splice_joins"] == FAMILIES
    assert run["stats"]["splice_fallbacks"] == 0
    # Children copy their parent's partial context block instead of
    # computing it (a wrong block there changes the parents' tokens).
    assert run["stats"]["splice_child_context_copied_tokens"] > 0
    checks = splice_families.oracle_check(tiny_model_dir, run)
    for family, check in zip(run["families"], checks):
        assert family["modes"] == ["splice"]
        assert family["prefilled"] == [suffix]  # the join computes only the suffix
        assert len(check["got"]) >= 16
        assert check["got"] == check["splice"], (check["fork"], check["paths"])


def test_splice_join_without_prefix_caching(runs, tiny_model_dir):
    run = runs("no-prefix-cache")
    _assert_clean(run)
    assert run["stats"]["splice_joins"] == FAMILIES
    assert run["stats"]["splice_child_context_copied_tokens"] > 0  # contexts copied
    for check in splice_families.oracle_check(tiny_model_dir, run):
        assert check["got"] == check["splice"]


def test_a_reprefill_join_is_what_the_oracle_tells_apart(runs, tiny_model_dir):
    run = runs("reprefill")
    _assert_clean(run)
    checks = splice_families.oracle_check(tiny_model_dir, run, causal=True)
    several = [c for c in checks if len(c["paths"]) > 1]
    assert len(several) >= 4
    assert all(c["got"] == c["causal"] for c in checks)
    assert sum(c["got"] != c["splice"] for c in several) >= len(several) - 1


def test_nested_splice_joins_equal_the_oracle(runs, tiny_model_dir):
    """Child 0 of each family forks 1-3 children of its own: its path holds
    their paths side by side and spans the positions its own splice join
    left it (fewer than its tokens); the outer join uses that extent."""
    run = runs("nested")
    _assert_clean(run)
    assert run["stats"]["splice_joins"] == 2 * FAMILIES
    assert run["stats"]["splice_fallbacks"] == 0
    checks = splice_families.oracle_check(tiny_model_dir, run, compare=32)
    for family, check in zip(run["families"], checks):
        assert family["modes"] == ["splice"] and family["inner"]["modes"] == ["splice"]
        assert check["got"] == check["splice"]


@pytest.mark.parametrize("prefix_caching", [True, False], ids=["prefix_cache", "no_prefix_cache"])
def test_a_parent_that_forks_again_after_a_splice_join(prefix_caching, runs, tiny_model_dir):
    """After its first splice join each parent writes on and forks 2-3
    children again: they start from its context, spliced paths included,
    at its positions, taking its KV (from the prefix cache and its partly
    filled last block, or without the prefix cache copied from its
    blocks), so the parent's tokens after its second join equal the
    oracle. A child that computed tokens of a spliced path again could
    only do it with causal attention: counted and traced."""
    run = runs("twice-" + ("prefix_cache" if prefix_caching else "no_prefix_cache"))
    _assert_clean(run)
    assert run["stats"]["splice_joins"] == 2 * FAMILIES
    assert run["stats"]["splice_fallbacks"] == 0
    families = run["families"]
    recomputed = [f["recomputed"] for f in families]
    assert run["stats"]["splice_recomputed_tokens"] == sum(recomputed)
    checks = splice_families.oracle_check(tiny_model_dir, run, compare=16)
    exact = [c["got"] == c["splice"] for c in checks]
    if prefix_caching:
        # A parent on its first child's adopted blocks takes their block
        # hashes, so its later children find them (without that, 3 of 9
        # families recomputed spliced tokens here).
        assert sum(1 for r in recomputed if not r) >= FAMILIES - 1
        assert all(ok for ok, r in zip(exact, recomputed) if not r)
    else:
        # Each child's context is copied from its parent's blocks (vLLM
        # gives no hit without the prefix cache): nothing is recomputed.
        assert not any(recomputed) and all(exact)


@pytest.mark.parametrize("mode", MODES[:2], ids=[m.id for m in MODES[:2]])
def test_splice_joins_after_spills_equal_the_oracle(mode, runs, tiny_model_dir):
    """A KV cache for 1,400 tokens (9 families of up to ~600 tokens each):
    parked parents are spilled. A spilled parent splices all the same: its
    context comes back from the prefix cache and (its last tokens) from its
    first child; its tokens after the join equal the oracle's. A join
    whose blocks cannot be had re-prefills, and then equals causal
    generation. Nothing waits forever, nothing is left behind."""
    run = runs(f"spills-{mode.id}")
    _assert_clean(run)
    stats = run["stats"]
    assert stats["spills"] >= FAMILIES // 2
    families = run["families"]
    after_spill = [f for f in families if f["modes"] == ["splice"] and f["after_spill"][0]]
    assert len(after_spill) == stats["splice_joins_after_spill"] >= 3
    checks = splice_families.oracle_check(tiny_model_dir, run, causal=True)
    for family, check in zip(families, checks):
        if family["modes"] == ["reprefill"]:
            assert check["got"] == check["causal"]
        elif not family["parent_recomputed"]:
            assert family["prefilled"] == [len(run["suffix"])]
            assert check["got"] == check["splice"], (check["fork"], check["paths"])


def test_splice_joins_with_chunked_prefill(runs, tiny_model_dir):
    """A step budget of 40 tokens for 9 families: prompts and children's
    prompts are computed over several steps, a join's suffix may be (the
    KV copies go with the parent's first step after its join, the shifts
    with every step); the parents' tokens still equal the oracle."""
    run = runs("chunked")
    _assert_clean(run)
    assert run["stats"]["splice_joins"] == FAMILIES
    assert run["stats"]["splice_fallbacks"] == 0
    for check in splice_families.oracle_check(tiny_model_dir, run):
        assert check["got"] == check["splice"], (check["fork"], check["paths"])
