"""The workers' side of a splice join (vllm_private.install_splice_inputs):
each engine mode shifts the positions of a request's tokens after its
prompt as the scheduler asks (its tokens equal a transformers forward with
the same positions), and
KV copies move exactly the slots asked for, in vLLM's own cache views."""

from __future__ import annotations

import random

import pytest

from vllm_seqhooks.core.splice_inputs import SpliceInputs
from vllm_seqhooks.testing import splice_oracle
from vllm_seqhooks.testing.engine_modes import MODES, run_in_mode


def test_copy_kv_slots_moves_each_slot_in_every_layer():
    import torch

    from vllm_seqhooks.engine.vllm_private import copy_kv_slots

    caches = [torch.randn(6, 2, 4, 3) for _ in range(2)]  # kernel blocks of 4 tokens
    before = [c.clone() for c in caches]
    src, dst = [1, 2, 13, 5], [20, 21, 2, 9]  # slot 2 is copied from, then to
    copy_kv_slots(caches, src, dst)
    for c, b in zip(caches, before):
        flat, old = c.permute(0, 2, 1, 3).reshape(24, 2, 3), b.permute(0, 2, 1, 3).reshape(24, 2, 3)
        for s, d in zip(src, dst):
            assert torch.equal(flat[d], old[s])  # every copy read the slots as they were
        others = [i for i in range(24) if i not in dst]
        assert torch.equal(flat[others], old[others])


def test_splice_inputs_pair_their_copies():
    assert not SpliceInputs()
    assert SpliceInputs(position_shift={"r": 3})
    with pytest.raises(ValueError, match="2 slots to copy from, 1 to copy to"):
        SpliceInputs(copy_from=[1, 2], copy_to=[3])


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.id)
def test_positions_shift_as_the_scheduler_asks(mode, tiny_model_dir):
    reason = mode.unavailable_reason()
    if reason:
        pytest.skip(reason)
    rng = random.Random(4)
    prompts = [[rng.randrange(9, 100) for _ in range(n)] for n in (9, 40, 71)]
    shift = -7  # (never below position 0, as after a join)
    res = run_in_mode(mode, "vllm_seqhooks.testing.splice_probe:shifted_generation",
                      kwargs=dict(model=tiny_model_dir, prompts=prompts, max_tokens=12,
                                  shift=shift))
    assert res["use_v2_model_runner"] == (mode.runner == "v2")
    assert res["async_scheduling"] == mode.async_scheduling
    assert res["kv_views_4d"] and res["copied"] and res["untouched"]
    model = splice_oracle.load(tiny_model_dir)
    for prompt, tokens in zip(prompts, res["tokens"]):
        assert tokens == splice_oracle.greedy_shifted(model, prompt, 12, shift)
        assert tokens != splice_oracle.greedy_causal(model, prompt, 12)  # the shift mattered
