"""The family grouping of the model's batch: the pure order, the V1 runner's
patch, the V2 runner's scheduler-side order."""

from __future__ import annotations

import random

import pytest

from vllm_seqhooks.core.batch_order import family_of, grouping_swaps
from vllm_seqhooks.core.request_tree import CHILD_ID_MARKER as M


def apply(ids, swaps):
    ids = list(ids)
    for i, j in swaps:
        ids[i], ids[j] = ids[j], ids[i]
    return ids


def test_family_of_strips_every_child_level():
    assert family_of("req-7") == "req-7"
    assert family_of(f"req-7{M}0") == "req-7"
    assert family_of(f"req-7{M}2{M}1") == "req-7"


def test_round_robin_arrival_is_grouped_in_first_seen_order():
    # child 0 of every family, then child 1 of every family
    ids = ["a", "b", "c", f"a{M}0", f"b{M}0", f"c{M}0", f"a{M}1", f"b{M}1", f"c{M}1"]
    out = apply(ids, grouping_swaps(ids))
    assert out == ["a", f"a{M}0", f"a{M}1", "b", f"b{M}0", f"b{M}1", "c", f"c{M}0", f"c{M}1"]


def test_grouped_batches_and_plain_requests_need_no_swap():
    assert grouping_swaps(["x", "y", "z"]) == []
    assert grouping_swaps([f"a{M}0", f"a{M}1", "b", f"c{M}0", f"c{M}0{M}0"]) == []
    assert grouping_swaps([]) == []


@pytest.mark.parametrize("seed", range(50))
def test_random_batches_end_contiguous_with_members_in_order(seed):
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
    assert len(swaps) < max(len(ids), 1)
    runs = [family_of(r) for i, r in enumerate(out) if i == 0 or family_of(out[i - 1]) != family_of(r)]
    assert len(runs) == len(set(runs))  # every family is one run
    first_seen = list(dict.fromkeys(family_of(r) for r in ids))
    assert runs == first_seen
    for f in first_seen:  # members keep their relative order
        assert [r for r in out if family_of(r) == f] == [r for r in ids if family_of(r) == f]


def test_batch_order_setting_is_validated():
    from vllm_seqhooks.config.special_kwargs import SpecialKwargs, SpecialKwargsError

    assert SpecialKwargs(sync_token_id=1, promise_token_id=2).batch_order == "family"
    assert SpecialKwargs(sync_token_id=1, promise_token_id=2, batch_order="arrival").batch_order == "arrival"
    with pytest.raises(SpecialKwargsError, match="batch_order"):
        SpecialKwargs(sync_token_id=1, promise_token_id=2, batch_order="random")


class _FakeBatch:
    def __init__(self, ids):
        self._ids = list(ids)
        self.swaps = []

    @property
    def req_ids(self):
        return self._ids

    @property
    def num_reqs(self):
        return len(self._ids)

    def swap_states(self, i1, i2):
        self.swaps.append((i1, i2))
        self._ids[i1], self._ids[i2] = self._ids[i2], self._ids[i1]


class _FakeRunner:
    def __init__(self, additional_config, ids):
        from types import SimpleNamespace

        self.vllm_config = SimpleNamespace(additional_config=additional_config)
        self.kv_cache_config = SimpleNamespace(kv_cache_groups=[])  # vLLM's part returns early
        self.input_batch = _FakeBatch(ids)


@pytest.mark.parametrize("extra, grouped", [
    ({"seqhooks": {"sync_token_id": 1, "promise_token_id": 2}}, True),
    ({"seqhooks": {"sync_token_id": 1, "promise_token_id": 2, "batch_order": "arrival"}}, False),
    ({}, False),  # a stock engine in the same process
    (None, False),
])
def test_installed_model_runner_hook_groups_only_engines_that_ask(extra, grouped):
    import vllm_seqhooks.engine.worker  # noqa: F401 - importing installs the hook
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    assert getattr(GPUModelRunner._may_reorder_batch, "_seqhooks_family_order", False)
    ids = ["a", "b", f"a{M}0", f"b{M}0"]
    runner = _FakeRunner(extra, ids)
    for _ in range(2):  # the second step finds the batch grouped already
        GPUModelRunner._may_reorder_batch(runner, None)
    if grouped:
        assert runner.input_batch.req_ids == ["a", f"a{M}0", "b", f"b{M}0"]
        assert runner.input_batch.swaps == [(1, 2)]  # one swap, and none in the second step
    else:
        assert runner.input_batch.req_ids == ids and runner.input_batch.swaps == []


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
    from vllm_seqhooks.testing import sched_setup

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

    from vllm_seqhooks.testing.sched_harness import (
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


def test_v2_runner_batches_keep_families_together(monkeypatch):
    grouped = _v2_batches(monkeypatch, "family")
    assert grouped and not any(_interleaved(b) for b in grouped)
    # Control: vLLM's own order interleaves the same workload.
    assert any(_interleaved(b) for b in _v2_batches(monkeypatch, "arrival"))


def test_grouped_order():
    from vllm_seqhooks.core.batch_order import grouped_order

    c = lambda p, i: f"{p}@seqhooks-child{i}"  # noqa: E731
    assert grouped_order(["a", "b", c("a", 0)]) == ["a", c("a", 0), "b"]
    assert grouped_order(["a", c("a", 0), "b"]) is None
    assert grouped_order(["a", "b"]) is None
