"""The workers' side of a splice join (vllm_private.install_splice_inputs):
each engine mode shifts the positions of a request's tokens after its
prompt as the scheduler asks (its tokens equal a transformers forward with
the same positions), and
KV copies move exactly the slots asked for, in vLLM's own cache views."""

from __future__ import annotations

import random

import pytest

from vllm_seqhooks.core.splice_inputs import SpliceInputs
from tests.support import splice_oracle
from tests.support.engine_modes import IN_PROCESS, MODES, run_in_mode


def test_copy_kv_slots_moves_each_token_where_the_backend_keeps_it():
    """A layout like the CPU backend's: a block holds its tokens' keys, then
    their values (token t: rows t and n + t of a [2n, d] view per head)."""
    import torch

    from vllm_seqhooks.engine.vllm_private import copy_kv_slots

    blocks, heads, n, d = 6, 2, 4, 3
    elements = torch.tensor([[(h, r // 2, (r % 2) * d + c) for h in range(heads)
                              for r in (t, n + t) for c in range(d)] for t in range(n)])
    caches = [torch.randn(blocks, heads, n, 2 * d) for _ in range(2)]
    before = [c.clone() for c in caches]

    def token(cache, slot):
        e = elements[slot % n]
        return cache[slot // n, e[:, 0], e[:, 1], e[:, 2]]

    src, dst = [1, 2, 13, 5], [20, 21, 2, 9]  # slot 2 is copied from, then to
    copy_kv_slots([(c, elements) for c in caches], src, dst)
    for c, b in zip(caches, before):
        for s, t in zip(src, dst):
            assert torch.equal(token(c, t), token(b, s))  # read before any write
        for slot in range(blocks * n):
            if slot not in dst:
                assert torch.equal(token(c, slot), token(b, slot))


def test_splice_inputs_pair_their_copies():
    assert not SpliceInputs()
    assert SpliceInputs(position_shift={"r": ((0, 3),)})
    with pytest.raises(ValueError, match="2 slots to copy from, 1 to copy to"):
        SpliceInputs(copy_from=[1, 2], copy_to=[3])


@pytest.mark.slow
@pytest.mark.parametrize("mode", [MODES[0], MODES[3]], ids=lambda m: m.id)  # V1 sync, V2 async
def test_positions_shift_as_the_scheduler_asks(mode, tiny_model_dir):
    reason = mode.unavailable_reason()
    if reason:
        pytest.skip(reason)
    rng = random.Random(4)
    prompts = [[rng.randrange(9, 100) for _ in range(n)] for n in (9, 40, 71)]
    shift = -7  # (never below position 0, as after a join)
    res = run_in_mode(mode, "tests.support.splice_probe:shifted_generation",
                      kwargs=dict(model=tiny_model_dir, prompts=prompts, max_tokens=12,
                                  shift=shift), env=IN_PROCESS)
    assert res["use_v2_model_runner"] == (mode.runner == "v2")
    assert res["async_scheduling"] == mode.async_scheduling
    assert res["kv_views_4d"] and res["copied"] and res["untouched"]
    model = splice_oracle.load(tiny_model_dir)
    for prompt, tokens in zip(prompts, res["tokens"]):
        assert tokens == splice_oracle.greedy_shifted(model, prompt, 12, shift)
        assert tokens != splice_oracle.greedy_causal(model, prompt, 12)  # the shift mattered


def test_step_runs_shift_their_part_of_a_requests_slice():
    """Runs shift each part of a request's tokens in the step by their own
    shift (a request recomputing spliced paths has several)."""
    import torch

    from vllm_seqhooks.engine.vllm_private.runner import _shift_positions

    positions = torch.arange(12)
    # Two requests: "a" tokens 0..4 of the step, "b" tokens 5..11.
    _shift_positions(positions, {"a": 0, "b": 1}.get, [0, 5, 12],
                     {"b": ((0, 0), (2, -3), (5, -4)), "gone": ((0, 9),)})
    assert positions.tolist() == [0, 1, 2, 3, 4, 5, 6, 4, 5, 6, 6, 7]
