"""Splice joins in the scheduler (surgical harness, the tiny model's
character tokenizer; sync and async scheduling): what a join sends the
workers, when it falls back to re-prefill, and that no block is left
behind. End to end against the oracle: tests/test_splice_join.py."""

from __future__ import annotations

import pytest

from vllm_seqhooks.config.field_checks import SpecialKwargsError
from vllm_seqhooks.engine.vllm_private import SPLICE_INPUTS_ATTR
from tests.support.sched_harness import EOS_ID as EOS
from tests.support.sched_harness import child_id

from tests.test_formats_engine import MODES, assert_idle, dec, enc, harness, hooks

GOAL = "<Parallel>\n<Goal>\n<Outline>1: a</Outline>\n<Outline>2: b</Outline>\n</Goal>"
PATH_1, PATH_2 = "\n<Path>\n1: alpha</Path>", "\n<Path>\n2: beta!"
SUFFIX = "\n<Conclusion>\n"


def splice_harness(async_sched: bool, **kwargs):
    h = harness("multiverse", async_sched, overrides={"join": "splice"}, **kwargs)
    sent = []
    h.after_schedule.append(lambda h, out: sent.append(
        (dict(out.num_scheduled_tokens), getattr(out, SPLICE_INPUTS_ATTR, None))))
    return h, sent


@MODES
@pytest.mark.parametrize("prefix_caching", [True, False], ids=["adopts", "copies"])
def test_the_join_copies_the_paths_and_prefills_the_suffix(async_sched, prefix_caching):
    """With the prefix cache on, the parent adopts its first child's whole
    blocks (its context and the first path's tokens in them) and copies the
    rest; without it, it keeps its own blocks and copies its fork tag's KV
    and every path."""
    h, sent = splice_harness(async_sched, enable_prefix_caching=prefix_caching)
    h.scripts["r"] = enc(GOAL + "x</Conclusion>\n</Parallel> 42") + [EOS]
    # Child 0 ends at its end tag (the step after it computes the tag's KV;
    # what it samples there is dropped); child 1 at EOS.
    h.scripts[child_id("r", 0)] = enc(" alpha</Path>never")
    h.scripts[child_id("r", 1)] = enc(" beta!") + [EOS]
    h.add("r", enc("Q:"), max_tokens=300)
    h.run(600)
    assert dec(h.tokens["r"]) == GOAL + PATH_1 + PATH_2 + SUFFIX + "x</Conclusion>\n</Parallel> 42</s>"
    (join,) = h.trace("r")["joins"]
    assert join["mode"] == "splice" and "fallback" not in join
    assert join["prefilled_tokens"] == len(enc(SUFFIX))
    paths = [len(enc(PATH_1)), len(enc(PATH_2))]
    steps = [(n, si) for n, si in sent if si is not None and si.copy_from and "r" in n]
    ((scheduled, splice),) = steps
    assert scheduled["r"] == len(enc(SUFFIX))  # the step that prefills the suffix
    context = len(enc("Q:" + GOAL))
    adopted = (context + paths[0]) // h.block_size * h.block_size if prefix_caching else 0
    assert join.get("splice_adopted_tokens", 0) == max(0, adopted - context)
    copied = 1 + sum(paths) - max(0, adopted - context + 1)  # fork tag + paths, less adopted
    assert len(splice.copy_from) == len(splice.copy_to) == copied
    assert len(set(splice.copy_to)) == len(splice.copy_to)
    shift = max(paths) - sum(paths)
    assert splice.position_shift == {"r": ((0, shift),)}
    # Every later step of the parent carries its shift.
    later = [si for n, si in sent[sent.index((scheduled, splice)) + 1:] if "r" in n]
    assert later and all(si is not None and si.position_shift == {"r": ((0, shift),)} for si in later)
    stats = h.sched.hook_stats
    assert (stats["splice_joins"], stats["spliced_tokens"], stats["splice_fallbacks"]) == (
        1, 1 + sum(paths), 0)
    assert stats["splice_adopted_tokens"] == max(0, adopted - context)
    # The first child took its parent's partial block of the context
    # (vLLM's copy-on-write of a partial prefix hit) instead of computing
    # it; the second found the first's copy, filled, in the prefix cache.
    # Without the prefix cache each child's context is copied slot by slot.
    keep = context - 1
    copied = keep % h.block_size if prefix_caching else 2 * keep
    assert stats["splice_child_context_copied_tokens"] == copied
    if not prefix_caching:
        child_steps = [si for n, si in sent if si is not None and si.copy_from and "r" not in n]
        assert sorted(len(si.copy_from) for si in child_steps) in ([keep, keep], [2 * keep])
    assert_idle(h)


@MODES
def test_a_child_out_of_tokens_makes_the_join_reprefill(async_sched):
    """Its last token's KV was never computed: the join falls back to
    re-prefill (the merge written as a re-prefill writes it), says why in
    the trace and counts it; the blocks held for it go back."""
    h, sent = splice_harness(async_sched)
    h.scripts["r"] = enc(GOAL + "x") + [EOS]
    h.scripts[child_id("r", 0)] = enc(" alpha</Path>")
    h.scripts[child_id("r", 1)] = enc(" beta" * 40)  # past its budget
    h.add("r", enc("Q:"), max_tokens=len(enc(GOAL)) + 30)
    h.run(600)
    (join,) = h.trace("r")["joins"]
    assert join["mode"] == "reprefill" and "ran out of tokens" in join["fallback"]
    assert h.sched.hook_stats["splice_fallbacks"] == 1
    assert not any(si is not None and si.copy_from for _, si in sent)
    assert dec(h.tokens["r"]).startswith(GOAL + PATH_1 + "\n<Path>\n2: beta")
    assert_idle(h)


@MODES
def test_an_abort_while_parked_gives_the_held_blocks_back(async_sched):
    h, _ = splice_harness(async_sched)
    h.scripts["r"] = enc(GOAL + "x") + [EOS]
    h.scripts[child_id("r", 0)] = enc(" a</Path>")
    h.scripts[child_id("r", 1)] = enc(" b" * 100)  # still running at the abort
    h.add("r", enc("Q:"), max_tokens=400)
    h.run_until(lambda: bool(h.sched.splicing.held), 300)
    assert h.sched.splicing.held  # child 0 finished, its blocks kept
    h.abort("r")
    h.run(100)
    assert_idle(h)


def test_splice_needs_a_tag_format_whose_paths_are_the_childrens_own():
    with pytest.raises(SpecialKwargsError, match="needs a tag format"):
        _promise_splice()
    with pytest.raises(SpecialKwargsError, match="child_eos_text=''"):
        hooks("threadweaver", join="splice")
    with pytest.raises(SpecialKwargsError, match="boundary_tokenization='ids'"):
        hooks("multiverse", join="splice", boundary_tokenization="text")
    assert hooks("npr", join="splice").join == "splice"


def _promise_splice():
    from vllm_seqhooks.config.special_kwargs import SpecialKwargs

    return SpecialKwargs(sync_token_id=6, promise_token_id=4, promise_end_token_id=5,
                         join="splice")


def test_splice_is_refused_with_speculative_decoding_and_mrope():
    from types import SimpleNamespace

    from vllm_seqhooks.engine.engine_support import unsupported_splice

    def config(spec=None, mrope=False):
        return SimpleNamespace(speculative_config=spec,
                               model_config=SimpleNamespace(uses_mrope=mrope, model="m"))

    assert unsupported_splice(config()) is None
    assert "speculative decoding" in unsupported_splice(config(spec=object()))
    assert "M-RoPE" in unsupported_splice(config(mrope=True))
    groups = SimpleNamespace(kv_cache_groups=[1, 2])
    assert "one KV cache group" in unsupported_splice(config(), groups)


def _pressured(num_blocks: int, async_sched: bool = False, on_update=None, **kwargs):
    """Three long plain requests, then a splice family, on a small cache:
    the parent resumes last, so it is the one vLLM preempts. ``on_update``:
    called after every update, as ``SchedHarness.after_update``'s are."""
    h, sent = splice_harness(async_sched, num_blocks=num_blocks, **kwargs)
    h.sent = sent
    if on_update is not None:
        h.after_update.append(on_update)
    for i in range(3):
        h.scripts[f"p{i}"] = enc("z" * 200) + [EOS]
        h.add(f"p{i}", enc("P" * 40), max_tokens=400)
    h.scripts["r"] = enc(GOAL + "x" * 150) + [EOS]
    h.scripts[child_id("r", 0)] = enc(" alpha</Path>")
    h.scripts[child_id("r", 1)] = enc(" beta!") + [EOS]
    h.add("r", enc("Q:"), max_tokens=400)
    h.run(3000)
    assert dec(h.tokens["r"]) == GOAL + PATH_1 + PATH_2 + SUFFIX + "x" * 150 + "</s>"
    assert_idle(h)
    return h


def test_a_spliced_parent_that_vllm_preempts_is_counted():
    h = _pressured(30)
    stats = h.sched.hook_stats
    assert "r" in h.preempted
    assert (stats["splice_joins"], stats["splice_recomputes"], stats["splice_fallbacks"]) == (1, 1, 0)


@pytest.mark.parametrize(("prefix_caching", "num_blocks"), [(True, 22), (False, 24), (False, 23)],
                         ids=["adopts", "copies", "copies-tight"])
@MODES
def test_a_parent_spilled_while_parked_still_splices(prefix_caching, num_blocks, async_sched):
    """Its KV went back to the pool while it waited: at the join it takes
    its first child's whole blocks (prefix cache on), or fresh blocks into
    which its context is copied from that child, whose context it is (with
    the paths, as always); only the suffix is computed."""
    h = _pressured(num_blocks, async_sched, enable_prefix_caching=prefix_caching)
    sent = h.sent
    (join,) = h.trace("r")["joins"]
    assert join["mode"] == "splice" and "fallback" not in join
    context = len(enc("Q:" + GOAL))
    adopted, copied = join.get("splice_adopted_tokens", 0), join.get("splice_context_copied", 0)
    assert join["splice_after_spill"]
    if prefix_caching:
        assert adopted and not copied
    else:
        assert copied == context and not adopted
    stats = h.sched.hook_stats
    assert stats["spills"] >= 1
    assert (stats["splice_joins"], stats["splice_joins_after_spill"], stats["splice_fallbacks"]) == (
        1, 1, 0)
    ((scheduled, splice),) = [(n, si) for n, si in sent
                              if si is not None and si.copy_from and "r" in n]
    paths = len(enc(PATH_1)) + len(enc(PATH_2))
    assert len(splice.copy_from) == copied + paths - adopted
    assert scheduled["r"] == len(enc(SUFFIX))  # still only the suffix is computed


def test_a_join_whose_blocks_are_not_free_waits_while_others_run():
    """Three plain requests fill the cache: the parent's join waits for
    their blocks instead of falling back."""
    h = _pressured(24)
    (join,) = h.trace("r")["joins"]
    assert join["mode"] == "splice"
    assert h.sched.hook_stats["splice_fallbacks"] == 0


@pytest.mark.parametrize("num_blocks", [21, 24])
def test_a_join_whose_blocks_cannot_be_free_reprefills(num_blocks):
    """Alone in a small cache, the parent's merge does not fit beside the
    blocks its children hold, and nothing runs that could free any: the
    join re-prefills (the children's blocks go back first) instead of
    waiting forever."""
    h, _ = splice_harness(False, num_blocks=num_blocks)
    h.scripts["r"] = enc(GOAL + "x" * 20) + [EOS]
    h.scripts[child_id("r", 0)] = enc(" " + "a" * 90 + "</Path>")
    h.scripts[child_id("r", 1)] = enc(" " + "b" * 90) + [EOS]
    h.add("r", enc("Q:"), max_tokens=400)
    h.run(3000)
    (join,) = h.trace("r")["joins"]
    assert join["mode"] == "reprefill" and "no free KV blocks" in join["fallback"]
    assert dec(h.tokens["r"]).endswith(SUFFIX + "x" * 20 + "</s>")
    assert h.sched.hook_stats["splice_fallbacks"] == 1
    assert_idle(h)


def test_held_blocks_given_back_make_the_join_reprefill():
    """What KV pressure does when nothing runs and a waiting request needs
    blocks: a finished child's held blocks go back; its parent's join then
    re-prefills, says why, and nothing is left behind."""
    h, _ = splice_harness(False)
    h.scripts["r"] = enc(GOAL + "x") + [EOS]
    h.scripts[child_id("r", 0)] = enc(" a</Path>")
    h.scripts[child_id("r", 1)] = enc(" b" * 30) + [EOS]
    h.add("r", enc("Q:"), max_tokens=400)
    h.run_until(lambda: bool(h.sched.splicing.held), 300)
    h.sched.splicing.release_held_for(lambda: True)
    assert not h.sched.splicing.held
    h.run(600)
    (join,) = h.trace("r")["joins"]
    assert join["mode"] == "reprefill" and "under KV pressure" in join["fallback"]
    assert h.sched.hook_stats["splice_holds_released"] == 1
    assert dec(h.tokens["r"]).startswith(GOAL + "\n<Path>\n1: a</Path>\n<Path>\n2:" + " b" * 30)
    assert_idle(h)


def test_a_child_of_a_spliced_parent_that_vllm_preempts_keeps_its_positions():
    """After its splice join the parent forks again: its new children
    inherit its positions (the second path back at the fork point, what
    follows behind by the shorter path). vLLM preempts them under KV
    pressure and they compute their context again: every token they
    compute, before and after, is sent with the position the join's layout
    gives it."""
    mid = "x</Conclusion>\n</Parallel>\n"
    h, sent = splice_harness(False, num_blocks=31)
    steps = []  # (request, first token computed in the step, count, shift runs)

    def record(h, out):
        si = getattr(out, SPLICE_INPUTS_ATTR, None)
        for rid, count in out.num_scheduled_tokens.items():
            if rid.startswith(child_id("r", 2)):
                first = h.sched.requests[rid].num_computed_tokens - count
                steps.append((first, count, (si.position_shift if si else {}).get(rid, ())))

    h.after_schedule.append(record)
    for i in range(3):
        h.scripts[f"p{i}"] = enc("z" * 200) + [EOS]
        h.add(f"p{i}", enc("P" * 40), max_tokens=400)
    h.scripts["r"] = enc(GOAL + mid + GOAL + "y") + [EOS]
    h.scripts[child_id("r", 0)] = enc(" alpha</Path>")
    h.scripts[child_id("r", 1)] = enc(" beta!") + [EOS]
    h.scripts[child_id("r", 2)] = enc(" " + "c" * 60 + "</Path>")
    h.scripts[child_id("r", 3)] = enc(" " + "d" * 60 + "</Path>")
    h.add("r", enc("Q:"), max_tokens=600)
    h.run(4000)
    assert_idle(h)
    assert child_id("r", 2) in h.preempted
    context, one, two = len(enc("Q:" + GOAL)), len(enc(PATH_1)), len(enc(PATH_2))

    def expected(i):  # the first join's layout
        if i < context + one:
            return i
        if i < context + one + two:
            return i - one
        return i - min(one, two)

    def sent_position(first, runs, i):
        shift = 0
        for offset, s in runs:
            if first + offset <= i:
                shift = s
        return i + shift

    starts = [first for first, _, _ in steps]
    assert any(b < a for a, b in zip(starts, starts[1:]))  # computed again after preemption
    for first, count, runs in steps:
        for i in range(first, first + count):
            assert sent_position(first, runs, i) == expected(i), (first, i, runs)
