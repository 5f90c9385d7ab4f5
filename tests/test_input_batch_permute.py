"""The V1 runner's persistent batch permuted in one pass
(``vllm_private.input_batch``) leaves what vLLM's own ``swap_states``, pair
by pair, leaves: every field of a real InputBatch, with every optional part
in use (seeded generators, bad words, allowed tokens, LoRA, prompt
embeddings, draft tokens, penalties), compared after both."""

from __future__ import annotations

import random

import numpy as np
import pytest

from vllm_seqhooks.core.batch_order import FamilyGrouping, moves_as_swaps
from vllm_seqhooks.core.request_tree import CHILD_ID_MARKER as M

MAX_REQS = 24
#: The device-side copies of the sampling arrays (the CPU here).
DEVICE_COPIES = ("temperature", "top_p", "top_k", "frequency_penalties", "presence_penalties",
                 "repetition_penalties")


def _batch(seed: int, n: int):
    import torch
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest
    from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch

    rng = random.Random(seed)
    batch = InputBatch(max_num_reqs=MAX_REQS, max_model_len=96, max_num_batched_tokens=256,
                       device=torch.device("cpu"), vocab_size=50, block_sizes=[16, 32],
                       max_num_blocks_per_req=[6, 3], num_spec_tokens=2)
    for name in DEVICE_COPIES:  # torch.empty: filled from the CPU arrays when used
        getattr(batch, name).zero_()
    for k in range(n):
        params = SamplingParams(
            max_tokens=8, temperature=rng.choice([0.0, 0.7, 1.3]), top_p=rng.choice([1.0, 0.9]),
            top_k=rng.choice([0, 5]), presence_penalty=rng.choice([0.0, 0.5]),
            frequency_penalty=rng.choice([0.0, 0.25]), repetition_penalty=rng.choice([1.0, 1.1]),
            seed=rng.choice([None, k]),
            allowed_token_ids=rng.choice([None, [1, 2, 3 + k % 5]]))
        if rng.random() < 0.3:
            params._bad_words_token_ids = [[7, 8 + k % 3]]
        generator = None
        if params.seed is not None:
            generator = torch.Generator().manual_seed(params.seed)
        prompt = [rng.randrange(50) for _ in range(rng.randint(3, 40))]
        embeds = torch.full((len(prompt), 4), float(k)) if rng.random() < 0.2 else None
        lora = LoRARequest(f"l{k % 2}", 1 + k % 2, "/nowhere") if rng.random() < 0.3 else None
        rid = f"f{rng.randrange(5)}{M}{k}"
        batch.add_request(CachedRequestState(
            req_id=rid, prompt_token_ids=prompt, mm_features=[], sampling_params=params,
            generator=generator, block_ids=([k, k + 1], [k]), num_computed_tokens=len(prompt) - 1,
            output_token_ids=[rng.randrange(50) for _ in range(rng.randint(0, 5))],
            lora_request=lora, prompt_embeds=embeds))
    batch.condense()
    batch.refresh_metadata()
    for row in range(n):
        if rng.random() < 0.4:
            batch.spec_token_ids[row].extend([rng.randrange(50), rng.randrange(50)])
        batch.num_accepted_tokens_cpu[row] = rng.randint(1, 3)
    return batch


def _active(batch, row: int) -> int:
    return int(batch.num_tokens_no_spec[row]) + len(batch.spec_token_ids[row])


TOKEN_FIELDS = ("token_ids_cpu", "is_token_ids", "token_ids_cpu_tensor", "is_token_ids_tensor")


def _same(a, b, path: str, rows: int, seen: set) -> list[str]:
    """Where ``a`` and ``b`` differ (rows past ``rows`` of per-request
    arrays hold whatever was there: not compared)."""
    import torch

    if id(a) in seen:
        return []
    seen.add(id(a))
    if isinstance(a, torch.Tensor):
        a, b = a.numpy(), b.numpy()
    if isinstance(a, np.ndarray):
        if a.ndim and a.shape[0] == MAX_REQS:
            a, b = a[:rows], b[:rows]
        return [] if np.array_equal(a, b, equal_nan=a.dtype.kind == "f") else [path]
    if isinstance(a, torch.Generator):
        return [] if torch.equal(a.get_state(), b.get_state()) else [path]
    if isinstance(a, dict):
        if a.keys() != b.keys():
            return [path]
        return [d for k in a for d in _same(a[k], b[k], f"{path}[{k!r}]", rows, seen)]
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return [path]
        return [d for k, (x, y) in enumerate(zip(a, b))
                for d in _same(x, y, f"{path}[{k}]", rows, seen)]
    if hasattr(a, "__dict__") and type(a).__module__.startswith("vllm"):
        return _same(vars(a), vars(b), path, rows, seen)
    try:
        return [] if a == b else [path]
    except Exception:  # noqa: BLE001 - objects without equality: same type is all we ask
        return [] if type(a) is type(b) else [path]


def _differences(one_pass, pairwise) -> list[str]:
    rows = pairwise.num_reqs
    found = []
    for name in TOKEN_FIELDS:  # only each row's active tokens are meaningful
        x, y = getattr(one_pass, name), getattr(pairwise, name)
        for row in range(rows):
            width = _active(pairwise, row)
            if not np.array_equal(np.asarray(x[row, :width]), np.asarray(y[row, :width])):
                found.append(f"{name}[{row}]")
    state_a = {k: v for k, v in vars(one_pass).items() if k not in TOKEN_FIELDS}
    state_b = {k: v for k, v in vars(pairwise).items() if k not in TOKEN_FIELDS}
    return found + _same(state_a, state_b, "batch", rows, set())


@pytest.mark.parametrize("seed", range(12))
def test_one_pass_leaves_what_swap_states_leaves(seed):
    from vllm_seqhooks.engine.vllm_private import input_batch

    n = random.Random(seed).randint(4, MAX_REQS)
    one_pass, pairwise = _batch(seed, n), _batch(seed, n)
    assert _differences(one_pass, pairwise) == []  # built alike
    moves = FamilyGrouping().moves(one_pass.req_ids)
    if moves is None or len(moves[0]) < input_batch.ONE_PASS_FROM:
        rng = np.random.default_rng(seed)  # then any permutation of the rows
        rows = rng.permutation(n)[: max(3, n // 2)]
        moves = (rows.tolist(), np.roll(rows, 1).tolist())
    assert input_batch._one_pass_allowed(type(one_pass))
    # the runner's bound on draft tokens (2 here), or read from the rows
    input_batch.permute_input_batch(one_pass, moves, 2 if seed % 2 else None)
    for i, j in moves_as_swaps(moves):
        pairwise.swap_states(i, j)
    assert _differences(one_pass, pairwise) == []
    assert one_pass.batch_update_builder.moved == pairwise.batch_update_builder.moved
    one_pass.refresh_metadata()
    pairwise.refresh_metadata()
    assert _differences(one_pass, pairwise) == []


def test_the_comparison_sees_a_field_left_behind(monkeypatch):
    """Control: a one-pass permutation that forgets one field fails it."""
    from vllm_seqhooks.engine.vllm_private import input_batch

    monkeypatch.setattr(input_batch, "SAMPLING_ROW_ARRAYS",
                        tuple(f for f in input_batch.SAMPLING_ROW_ARRAYS if f != "top_k_cpu"))
    one_pass, pairwise = _batch(3, 20), _batch(3, 20)
    moves = (list(range(20)), [19, *range(19)])
    input_batch.permute_input_batch(one_pass, moves)
    for i, j in moves_as_swaps(moves):
        pairwise.swap_states(i, j)
    assert "batch['top_k_cpu']" in _differences(one_pass, pairwise)


def test_another_swap_states_falls_back_to_pairs(monkeypatch, caplog):
    """On a vLLM whose swap_states is not the pinned one, the batch is
    permuted with that swap_states, pair by pair, and the log says why."""
    from vllm.v1.worker.gpu_input_batch import InputBatch

    from vllm_seqhooks.engine.vllm_private import input_batch

    class Changed(InputBatch):
        def swap_states(self, i1, i2):
            calls.append((i1, i2))
            super().swap_states(i1, i2)

    calls = []
    batch = _batch(5, 10)
    batch.__class__ = Changed
    assert any("swap_states" in p for p in input_batch.input_batch_problems(Changed))
    moves = ([0, 1, 2, 3, 4, 5], [5, 0, 1, 2, 3, 4])
    with caplog.at_level("WARNING", logger="vllm.seqhooks"):
        input_batch.permute_input_batch(batch, moves)
    assert calls == moves_as_swaps(moves) and len(calls) == 5
    assert "pair by pair" in caplog.text


