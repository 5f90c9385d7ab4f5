"""The transformers oracle of a splice join (testing/splice_oracle.py):
it computes what plain generation computes when nothing is parallel,
honours the path isolation it is given, and tells a splice join from a
re-prefill join of the same tokens."""

from __future__ import annotations

import random

import pytest

from vllm_seqhooks.core.splice_layout import Parallel
from tests.support import splice_oracle


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return splice_oracle.load(tiny_model_dir)


def text(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(9, 100) for _ in range(n)]  # printable characters


def family(rng: random.Random, paths: int):
    prefix = text(rng, rng.randint(3, 40))
    bodies = [text(rng, rng.randint(1, 20)) for _ in range(paths)]
    suffix = text(rng, rng.randint(1, 3))
    ids = prefix + [t for body in bodies for t in body] + suffix
    layout = (len(prefix), Parallel(tuple((len(b),) for b in bodies)), len(suffix))
    return ids, layout, prefix, bodies


def test_causal_oracle_is_plain_greedy_generation(model):
    import torch

    ids = text(random.Random(0), 25)
    want = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False,
                          pad_token_id=0)[0, len(ids):].tolist()
    assert splice_oracle.greedy_causal(model, ids, 12) == want


def test_logprobs_are_a_plain_forward_pass_when_nothing_is_parallel(model):
    import torch

    rng = random.Random(3)
    ids, tokens = text(rng, 20), text(rng, 6)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids + tokens])).logits[0]
    want = [float(torch.log_softmax(logits[len(ids) - 1 + i], -1)[t]) for i, t in enumerate(tokens)]
    got = splice_oracle.logprobs_after_join(model, ids, (len(ids),), tokens)
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-5
    ids, layout, _, _ = family(rng, paths=3)  # isolated paths change them
    spliced = splice_oracle.logprobs_after_join(model, ids, layout, tokens)
    causal = splice_oracle.logprobs_after_join(model, ids, (len(ids),), tokens)
    assert max(abs(a - b) for a, b in zip(spliced, causal)) > 1e-3


def test_one_path_is_plain_causal_generation(model):
    rng = random.Random(1)
    for _ in range(5):
        ids, layout, _, _ = family(rng, paths=1)
        assert splice_oracle.greedy_after_join(model, ids, layout, 8) == \
            splice_oracle.greedy_causal(model, ids, 8)


def test_a_path_sees_the_shared_context_and_itself_only(model):
    """The last token of path 2 predicts what path 2 alone predicts after
    the shared context, whatever path 1 holds."""
    rng = random.Random(2)
    for _ in range(8):
        ids, layout, prefix, bodies = family(rng, paths=2)
        in_path_two = (layout[0], layout[1])  # ends with path 2's last token
        cut = ids[:len(prefix) + len(bodies[0]) + len(bodies[1])]
        alone = splice_oracle.greedy_causal(model, prefix + bodies[1], 1)[0]
        assert splice_oracle.next_token(model, cut, in_path_two) == alone


def test_the_oracle_tells_a_splice_from_a_reprefill(model):
    rng = random.Random(3)
    differ = 0
    for _ in range(20):
        ids, layout, _, _ = family(rng, paths=rng.randint(2, 4))
        differ += (splice_oracle.greedy_after_join(model, ids, layout, 6)
                   != splice_oracle.greedy_causal(model, ids, 6))
    assert differ >= 15


def test_a_layout_must_hold_the_tokens(model):
    with pytest.raises(ValueError, match="holds 3 tokens"):
        splice_oracle.next_token(model, [10, 11], (3,))
