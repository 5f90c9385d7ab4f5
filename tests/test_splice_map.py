"""SpliceMap (core/splice_map.py): the positions it gives every token of a
request that spliced, nested or one join after another, are the positions
of the declared layout (core/splice_layout.py); what one step of it sends
the runner; where causal recomputation stops being exact."""

from __future__ import annotations

import random

import pytest

from vllm_seqhooks.core import splice_layout
from vllm_seqhooks.core.splice_layout import Parallel
from vllm_seqhooks.core.splice_map import SpliceMap, SplicePath


def _positions(m: SpliceMap, n: int) -> list[int]:
    return [i + m.shift_at(i) for i in range(n)]


def test_two_paths():
    m = SpliceMap().after_join(5, [SplicePath(5, 3, SpliceMap()), SplicePath(8, 4, SpliceMap())])
    assert _positions(m, 14) == [0, 1, 2, 3, 4, 5, 6, 7, 5, 6, 7, 8, 9, 10]
    assert m.isolated == ((8, 12),) and m.final == -3


def test_one_path_changes_nothing():
    assert not SpliceMap().after_join(4, [SplicePath(4, 9, SpliceMap())])


def _grow(rng: random.Random, context: int, inherited: SpliceMap, depth: int):
    """A request that starts with ``context`` tokens and map ``inherited``
    writes some tokens, maybe forks (children inherit its map), joins and
    writes on, up to twice; returns its layout after ``context``, its map
    and its token count."""
    layout: list = []
    m, n = inherited, context
    for _ in range(rng.randint(0, 2) if depth < 2 else 0):
        run = rng.randint(1, 7)
        layout.append(run)
        n += run
        kids = [_grow(rng, n, m, depth + 1) for _ in range(rng.randint(1, 4))]
        paths, at = [], n
        for kid_layout, kid_map, kid_n in kids:
            paths.append(SplicePath(at, kid_n - n, kid_map))
            at += kid_n - n
        m = m.after_join(n, paths)
        layout.append(Parallel(tuple(tuple(k[0]) for k in kids)))
        n = at
    tail = rng.randint(1, 6)
    layout.append(tail)
    return layout, m, n + tail


@pytest.mark.parametrize("seed", range(40))
def test_positions_are_the_layouts(seed):
    rng = random.Random(seed)
    context = rng.randint(1, 9)
    layout, m, n = _grow(rng, context, SpliceMap(), 0)
    full = (context, *layout)
    assert splice_layout.token_count(full) == n
    assert _positions(m, n) == splice_layout.positions(full)
    # The isolated tokens are those hidden from some earlier token: the ones
    # causal attention would compute differently.
    mask = splice_layout.attention_mask(full)
    hidden = [j for j in range(n) if not all(mask[j][: j + 1])]
    assert [j for j in range(n) if m.isolated_among(j, 1)] == hidden
    first = rng.randrange(n)
    assert m.isolated_among(first, n - first) == sum(j >= first for j in hidden)


@pytest.mark.parametrize("seed", range(20))
def test_step_runs_shift_each_token_of_a_step(seed):
    rng = random.Random(seed)
    _, m, n = _grow(rng, rng.randint(1, 9), SpliceMap(), 0)
    first = rng.randrange(n)
    count = rng.randint(1, n - first)
    runs = m.step_runs(first, count)
    shifted = list(range(first, first + count))
    for k, (offset, shift) in enumerate(runs):
        end = runs[k + 1][0] if k + 1 < len(runs) else count
        shifted[offset:end] = [p + shift for p in shifted[offset:end]]
    assert shifted == _positions(m, n)[first:first + count]


def test_runs_must_ascend():
    with pytest.raises(ValueError):
        SpliceMap(((5, -1), (3, -2)))
