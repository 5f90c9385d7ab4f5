"""The family grouping of the model's batch: the pure order, the V1 runner's
patch, the V2 runner's scheduler-side order."""

from __future__ import annotations

import random

import pytest

from vllm_seqhooks.core.batch_order import FamilyGrouping, family_of, moves_as_swaps
from vllm_seqhooks.core.request_tree import CHILD_ID_MARKER as M
from tests.support.batch_churn import finish_some


def apply(ids, swaps):
    ids = list(ids)
    for i, j in swaps:
        ids[i], ids[j] = ids[j], ids[i]
    return ids


def grouping_swaps(ids):
    moves = FamilyGrouping().moves(ids)
    return [] if moves is None else moves_as_swaps(moves)


def moved_rows(ids):
    moves = FamilyGrouping().moves(ids)
    return [] if moves is None else moves[0]


def test_family_of_strips_every_child_level():
    assert family_of("req-7") == "req-7"
    assert family_of(f"req-7{M}0") == "req-7"
    assert family_of(f"req-7{M}2{M}1") == "req-7"


def blocks(ids):
    """The batch as (family, set of members) runs."""
    out = []
    for rid in ids:
        if out and out[-1][0] == family_of(rid):
            out[-1][1].add(rid)
        else:
            out.append((family_of(rid), {rid}))
    return out


def test_round_robin_arrival_is_grouped_in_first_seen_order():
    # child 0 of every family, then child 1 of every family
    ids = ["a", "b", "c", f"a{M}0", f"b{M}0", f"c{M}0", f"a{M}1", f"b{M}1", f"c{M}1"]
    out = apply(ids, grouping_swaps(ids))
    assert blocks(out) == [(f, {f, f"{f}{M}0", f"{f}{M}1"}) for f in "abc"]


def test_grouped_batches_and_plain_requests_need_no_swap():
    assert grouping_swaps(["x", "y", "z"]) == []
    assert grouping_swaps([f"a{M}0", f"a{M}1", "b", f"c{M}0", f"c{M}0{M}0"]) == []
    assert grouping_swaps([]) == []


def grouped(families, size):
    return [f"{f}{M}{k}" for f in families for k in range(size)]


def test_a_request_entering_moves_one_request_per_block_it_crosses():
    """The V1 runner appends a new request at the end of the batch (or puts
    it in the hole a finished one left): its family's block grows by one
    and each block after it moves by one, one request each; members already
    in their block stay."""
    ids = grouped("abcd", 3) + [f"a{M}9"]
    assert len(moved_rows(ids)) == 4
    assert len(grouping_swaps(ids)) == 3
    assert [f for f, _ in blocks(apply(ids, grouping_swaps(ids)))] == list("abcd")
    # b's middle member finished; the runner moved d's last member into the hole
    ids = grouped("abcd", 3)
    ids[4] = ids.pop()
    assert len(grouping_swaps(ids)) == 2
    assert [f for f, _ in blocks(apply(ids, grouping_swaps(ids)))] == list("abcd")


@pytest.mark.parametrize("seed", range(50))
def test_random_batches_end_contiguous(seed):
    rng = random.Random(seed)
    fams = [f"r{i}" for i in range(rng.randint(1, 8))]
    ids = []
    for f in fams:
        ids.append(f)
        ids += [f"{f}{M}{k}" for k in range(rng.randint(0, 4))]
    rng.shuffle(ids)
    swaps = grouping_swaps(ids)
    out = apply(ids, swaps)
    assert sorted(out) == sorted(ids)
    runs = [f for f, _ in blocks(out)]
    assert len(runs) == len(set(runs))  # every family is one run
    # Only members outside their family's final block move, each swap
    # placing at least one.
    owner = [family_of(r) for r in out]
    misplaced = sum(family_of(r) != owner[i] for i, r in enumerate(ids))
    assert len(swaps) <= misplaced
    moved = {i for swap in swaps for i in swap}
    assert all(family_of(ids[i]) != owner[i] for i in moved)


def test_moves_and_their_swaps_are_one_permutation():
    rng = random.Random(7)
    for _ in range(200):
        ids = [f"f{rng.randrange(6)}{M}{k}" for k in range(rng.randint(0, 30))]
        moves = FamilyGrouping().moves(ids)
        if moves is None:
            assert len(blocks(ids)) == len({family_of(r) for r in ids})
            continue
        dst, src = moves
        assert sorted(dst) == sorted(src)  # a permutation of these rows
        by_moves = list(ids)
        for d, s in zip(dst, src):
            by_moves[d] = ids[s]
        assert apply(ids, moves_as_swaps(moves)) == by_moves
        # every cycle of k rows is k - 1 swaps
        assert len(moves_as_swaps(moves)) < len(dst)


@pytest.mark.parametrize("seed", range(5))
def test_a_kept_grouping_decides_as_a_fresh_one(seed):
    """Step after step (requests entering at the end or in a finished one's
    hole, the last moved into a hole, an equal id in a new string object),
    the grouping that remembers the last batch moves exactly what one that
    reads the whole batch afresh moves, and the batch ends grouped."""
    rng = random.Random(seed)
    kept = FamilyGrouping(forget_after=60)
    ids: list[str] = []
    serial = 0
    for _ in range(120):
        finish_some(ids, rng, 4)  # the runner condenses
        for _ in range(rng.randint(0, 5)):
            serial += 1
            ids.append(f"r{rng.randrange(8)}{M}{serial}")
        if ids and rng.random() < 0.2:  # the same id, another object
            k = rng.randrange(len(ids))
            ids[k] = "".join(list(ids[k]))
        moves = kept.moves(ids)
        fresh = FamilyGrouping().moves(ids)
        assert (moves is None) == (fresh is None)
        if moves is not None:  # the same permutation (listed by family codes)
            assert dict(zip(*moves)) == dict(zip(*fresh))
        if moves is not None:
            ids = apply(ids, moves_as_swaps(moves))
        assert len(blocks(ids)) == len({family_of(r) for r in ids})


def test_family_codes_are_remembered_and_forgotten_in_bulk():
    grouping = FamilyGrouping(forget_after=4)
    ids = ["a", f"b{M}0", f"a{M}0", "b"]
    codes = grouping.codes(ids)
    assert codes[0] == codes[2] != codes[1] == codes[3]
    assert grouping.moves(ids) is not None  # a and b interleaved
    assert grouping.moves(["c", "d", f"c{M}1"]) is not None
    assert len(grouping._code_of_request) == 7  # past forget_after: forgotten next
    assert grouping.moves(["c", f"c{M}1", "d"]) is None  # read afresh, still right
    assert len(grouping._code_of_request) == 3
    # d keeps its first run (row 0): row 1 takes d{M}2 from row 3, row 3 takes c
    assert grouping.moves(["d", "c", f"c{M}1", f"d{M}2"]) == ([3, 1], [1, 3])


def test_batch_order_setting_is_validated():
    from vllm_seqhooks.config.special_kwargs import SpecialKwargs, SpecialKwargsError

    assert SpecialKwargs(sync_token_id=1, promise_token_id=2).batch_order == "family"
    assert SpecialKwargs(sync_token_id=1, promise_token_id=2, batch_order="arrival").batch_order == "arrival"
    with pytest.raises(SpecialKwargsError, match="batch_order"):
        SpecialKwargs(sync_token_id=1, promise_token_id=2, batch_order="random")


class _FakeBatch:
    def __init__(self, ids):
        from types import SimpleNamespace

        self._ids = list(ids)
        self.swaps = []
        # The requests entered the batch in this step.
        self.batch_update_builder = SimpleNamespace(added=list(ids), moved=[])

    @property
    def req_ids(self):
        return self._ids

    @property
    def num_reqs(self):
        return len(self._ids)

    def swap_states(self, i1, i2):
        self.swaps.append((i1, i2))
        self.batch_update_builder.moved.append((i1, i2))
        self._ids[i1], self._ids[i2] = self._ids[i2], self._ids[i1]


def _set_up_as_a_worker() -> None:
    """What vLLM does with the worker extension in each worker: it imports
    it (which installs the hook on a release without extension hooks, 0.32)
    and, on a release with them (0.33), calls ``init_worker_extension``."""
    from vllm_seqhooks.engine.vllm_private.releases import installed
    from vllm_seqhooks.engine.worker import SeqHooksWorkerExtension

    if installed().calls_worker_extension_init:
        SeqHooksWorkerExtension.init_worker_extension(None)


class _FakeRunner:
    def __init__(self, additional_config, ids):
        from types import SimpleNamespace

        self.vllm_config = SimpleNamespace(additional_config=additional_config)
        self.kv_cache_config = SimpleNamespace(kv_cache_groups=[])  # vLLM's part returns early
        self.num_spec_tokens = 0
        self.input_batch = _FakeBatch(ids)


@pytest.mark.parametrize("extra, grouped", [
    ({"seqhooks": {"sync_token_id": 1, "promise_token_id": 2}}, True),
    ({"seqhooks": {"sync_token_id": 1, "promise_token_id": 2, "batch_order": "arrival"}}, False),
    ({}, False),  # a stock engine in the same process
    (None, False),
])
def test_installed_model_runner_hook_groups_only_engines_that_ask(extra, grouped):
    _set_up_as_a_worker()
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    assert getattr(GPUModelRunner._may_reorder_batch, "_seqhooks_family_order", False)
    ids = ["a", "b", f"a{M}0", f"b{M}0"]
    runner = _FakeRunner(extra, ids)
    for _ in range(2):  # the second step finds the batch grouped already
        GPUModelRunner._may_reorder_batch(runner, None)
        runner.input_batch.batch_update_builder.added.clear()
        runner.input_batch.batch_update_builder.moved.clear()
    if grouped:
        assert runner.input_batch.req_ids == ["a", f"a{M}0", "b", f"b{M}0"]
        assert runner.input_batch.swaps == [(1, 2)]  # one swap, and none in the second step
    else:
        assert runner.input_batch.req_ids == ids and runner.input_batch.swaps == []


def _real_input_batch():
    import torch
    from vllm import SamplingParams
    from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch

    batch = InputBatch(max_num_reqs=32, max_model_len=256, max_num_batched_tokens=256,
                       device=torch.device("cpu"), vocab_size=100, block_sizes=[16],
                       max_num_blocks_per_req=[16])

    def add(rid):
        batch.add_request(CachedRequestState(
            req_id=rid, prompt_token_ids=[1, 2, 3], mm_features=[],
            sampling_params=SamplingParams(max_tokens=4), generator=None,
            block_ids=([1],), num_computed_tokens=0, output_token_ids=[]))

    return batch, add


def test_v1_runner_regroups_only_when_a_request_entered_or_moved(monkeypatch):
    """On vLLM's own InputBatch: a step in which no request entered the
    batch and none was moved moves nothing and reads no request id; a
    request that entered, or one the runner moved into a hole, is grouped
    with its family at the next reorder."""
    _set_up_as_a_worker()
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    batch, add = _real_input_batch()
    runner = _FakeRunner({"seqhooks": {"sync_token_id": 1, "promise_token_id": 2}}, [])
    runner.input_batch = batch

    def step():
        """The pairs the grouping exchanged (as recorded for the logits
        processors, in one pass or pair by pair)."""
        batch.condense()
        before = len(batch.batch_update_builder.moved)
        GPUModelRunner._may_reorder_batch(runner, None)
        swaps = len(batch.batch_update_builder.moved) - before
        batch.refresh_metadata()  # what the runner does next: the step's changes are spent
        return swaps

    for rid in ["a", "b", "c", f"a{M}0", f"b{M}0", f"c{M}0"]:
        add(rid)
    assert step() > 0
    assert [f for f, _ in blocks(batch.req_ids)] == list("abc")
    assert step() == 0
    monkeypatch.setattr(type(batch), "req_ids", property(lambda self: pytest.fail("read")))
    assert step() == 0  # nothing changed: the ids are not even read
    monkeypatch.undo()
    add(f"a{M}1")  # appended after c's block
    assert step() == 2
    assert [f for f, _ in blocks(batch.req_ids)] == list("abc")
    assert all(batch.req_id_to_index[rid] == i for i, rid in enumerate(batch.req_ids))
    batch.remove_request(f"b{M}0")  # the runner moves the last request into its hole
    assert step() <= 1
    assert sorted(f for f, _ in blocks(batch.req_ids)) == list("abc")  # each family one run


def test_engines_with_hooks_load_the_worker_extension():
    from vllm_seqhooks.config.special_kwargs import SpecialKwargs
    from vllm_seqhooks.engine import WORKER_EXTENSION_CLASS_PATH
    from vllm_seqhooks.engine.engine_args import hook_engine_args

    hooks = SpecialKwargs(sync_token_id=1, promise_token_id=2, merge_separator_token_ids=[3])
    assert hook_engine_args(hooks, {})["worker_extension_cls"] == WORKER_EXTENSION_CLASS_PATH
    # a user's own extension is kept (the scheduler then installs the order)
    assert hook_engine_args(hooks, {"worker_extension_cls": "my.Ext"})[
        "worker_extension_cls"] == "my.Ext"
    module, name = WORKER_EXTENSION_CLASS_PATH.rsplit(".", 1)
    import importlib

    assert isinstance(getattr(importlib.import_module(module), name), type)


@pytest.mark.parametrize("extension, batch_order, installs", [
    ("vllm_seqhooks.engine.worker.SeqHooksWorkerExtension", "family", False),  # the workers do it
    ("my.own.Extension", "family", True),  # ours was replaced: the scheduler does it
    ("", "family", True),
    ("", "arrival", False),
])
def test_scheduler_installs_the_order_only_without_our_worker_extension(
        monkeypatch, extension, batch_order, installs):
    from vllm_seqhooks.engine import patches
    from tests.support import sched_setup

    calls = []
    monkeypatch.setattr(patches, "install_worker_patches", lambda: calls.append(1))
    make_config = sched_setup.make_vllm_config

    def with_extension(*args, **kwargs):
        cfg = make_config(*args, **kwargs)
        cfg.parallel_config.worker_extension_cls = extension
        return cfg

    monkeypatch.setattr(sched_setup, "make_vllm_config", with_extension)
    sched_setup.make_scheduler(False, hooks={"batch_order": batch_order})
    assert bool(calls) == installs


# ---------------------------------------------------------------------------
# Model Runner V2: the order comes from the scheduler output
# ---------------------------------------------------------------------------
def _v2_batches(monkeypatch, batch_order: str) -> list[list[str]]:
    """Decode batches as vLLM's V2 runner orders them (its own
    ``sort_batch_req_ids``), for 4 families whose children start together
    (child 0 of every family, then child 1 of every family)."""
    import vllm.config.vllm as vllm_config_module
    from vllm.v1.worker.gpu.model_runner import sort_batch_req_ids

    from tests.support.sched_harness import (
        EOS_ID, PROMISE_END_ID as E, PROMISE_ID as P, SYNC_ID as S, SchedHarness, child_id)

    # The scheduler is built for the V2 runner (no model runs here, so
    # vLLM's check that Triton is importable is waived).
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    monkeypatch.setattr(vllm_config_module, "HAS_TRITON", True)
    h = SchedHarness(False, hooks={"batch_order": batch_order}, num_blocks=200,
                     max_num_seqs=32)
    assert h.sched.use_v2_model_runner
    for f in range(4):
        rid = f"fam{f}"
        h.add(rid, [30 + f] * 20, max_tokens=60,
              script=[P, 41, E, P, 42, E, P, 43, E, S, EOS_ID])
        for c in range(3):
            h.scripts[child_id(rid, c)] = [60 + c] * 12 + [EOS_ID]
    batches = []
    h.after_schedule.append(lambda hh, out: batches.append(
        [r for r in sort_batch_req_ids(out.num_scheduled_tokens,
                                       out.scheduled_spec_decode_tokens, 1)
         if out.num_scheduled_tokens[r] == 1]))
    h.run(max_steps=200)
    return batches


def _interleaved(batch: list[str]) -> bool:
    runs = [family_of(r) for i, r in enumerate(batch)
            if i == 0 or family_of(batch[i - 1]) != family_of(r)]
    return len(runs) != len(set(runs))


def test_v2_runner_batcheskeep_families_together(monkeypatch):
    grouped = _v2_batches(monkeypatch, "family")
    assert grouped and not any(_interleaved(b) for b in grouped)
    # Control: vLLM's own order interleaves the same workload.
    assert any(_interleaved(b) for b in _v2_batches(monkeypatch, "arrival"))


class _NoSort(list):
    def sort(self, *args, **kwargs):
        raise AssertionError("sorted")


def test_v2_order_moves_only_the_requests_that_joined():
    """The scheduler keeps its running requests in arrival order; a step
    moves only the requests vLLM appended in it, and a step with none
    does nothing."""
    from types import SimpleNamespace

    from vllm_seqhooks.core.batch_order import keep_families_together

    def req(rid, arrival):
        return SimpleNamespace(request_id=rid, arrival_time=arrival)

    def output(*new, resumed=()):  # the requests that joined ``running``
        return [*new, *resumed]

    a, b, c = req("a", 1.0), req("b", 2.0), req("c", 3.0)
    running = _NoSort([a, b, c, req(f"a{M}0", 1.0), req(f"b{M}0", 2.0)])
    keep_families_together(running, output(f"a{M}0", resumed=[f"b{M}0"]), True)
    assert [family_of(r.request_id) for r in running] == list("aabbc")
    keep_families_together(running, output(), True)  # nothing joined: untouched
    # Not known to be in order (children just appeared): sorted, stably.
    running = [c, req(f"c{M}0", 3.0), a, b]
    keep_families_together(running, output(), False)
    assert [r.request_id for r in running] == ["a", "b", "c", f"c{M}0"]


def test_the_worker_extension_installs_the_hook_where_vllm_sets_workers_up():
    """In a fresh process: on a vLLM release that calls a worker
    extension's ``init_worker_extension`` (0.33) that call installs the
    family order, not the import; on one that does not (0.32), the import
    does."""
    import subprocess
    import sys

    script = (
        "from vllm.v1.worker.gpu_model_runner import GPUModelRunner as R\n"
        "from vllm_seqhooks.engine.worker import SeqHooksWorkerExtension as X\n"
        "from vllm_seqhooks.engine.vllm_private.releases import installed\n"
        "mark = lambda: getattr(R._may_reorder_batch, '_seqhooks_family_order', False)\n"
        "after_import = mark()\n"
        "X.init_worker_extension(None)\n"
        "print(installed().calls_worker_extension_init, after_import, mark())\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    hooks, after_import, after_init = done.stdout.split()[-3:]
    assert after_init == "True"
    assert after_import == ("False" if hooks == "True" else "True")
