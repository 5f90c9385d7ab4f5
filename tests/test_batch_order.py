"""The family grouping of the model's batch (pure logic) and the private vLLM
API it and the scheduler rely on."""

from __future__ import annotations

import random

import pytest

from vllm_seqhooks.batch_order import family_of, grouping_swaps
from vllm_seqhooks.dependencies import CHILD_ID_MARKER as M


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


def test_pinned_private_vllm_api_is_present():
    """Fails loudly when vLLM changes under the pin: every private name the
    scheduler and the batch grouping use, with its signature."""
    from vllm_seqhooks import _vllm_private

    assert _vllm_private.problems() == []
    assert _vllm_private.model_runner_problems() == []


def test_a_changed_private_api_is_reported(monkeypatch):
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.worker.gpu_input_batch import InputBatch

    from vllm_seqhooks import _vllm_private

    monkeypatch.setattr(Scheduler, "_free_request", lambda self, request: None)
    monkeypatch.setattr(InputBatch, "swap_states", lambda self, a, b: None)
    assert any("_free_request" in p for p in _vllm_private.problems())
    assert any("swap_states" in p for p in _vllm_private.model_runner_problems())
    monkeypatch.setattr(_vllm_private, "_checked", False)
    with pytest.raises(_vllm_private.VllmPrivateAPIError, match="_free_request"):
        _vllm_private.check()


def test_batch_order_setting_is_validated():
    from vllm_seqhooks.config import SpecialKwargs, SpecialKwargsError

    assert SpecialKwargs(sync_token_id=1, promise_token_id=2).batch_order == "family"
    assert SpecialKwargs(sync_token_id=1, promise_token_id=2, batch_order="arrival").batch_order == "arrival"
    with pytest.raises(SpecialKwargsError, match="batch_order"):
        SpecialKwargs(sync_token_id=1, promise_token_id=2, batch_order="random")
