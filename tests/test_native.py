"""The compiled kernels of the family batch order (vllm_seqhooks/native/*.c)
give what their Python implementations give, and refuse bad arguments
without changing anything."""

from __future__ import annotations

import random
import sys

import numpy as np
import pytest

from vllm_seqhooks import native
from vllm_seqhooks.core.batch_order import (
    FamilyGrouping,
    grouping_moves_in_python,
    moves_as_swaps,
)
from vllm_seqhooks.core.request_tree import CHILD_ID_MARKER as M
from vllm_seqhooks.testing.batch_churn import finish_some

if native.rows is None and native.why_not == f"{native.ENV}=0":
    pytest.skip(native.why_not, allow_module_level=True)
rows = native.rows


def test_the_kernels_are_built():
    """pip builds them wherever this package is installed with a C compiler
    (CI included); the Python implementations are the fallback."""
    assert rows is not None, native.why_not


def _random_codes(rng: random.Random) -> list[int]:
    n = rng.randint(0, 80)
    families = rng.randint(1, 12)
    offset = rng.choice([0, 0, 1000, 2**20])  # codes need not start at 0
    codes = [offset + rng.randrange(families) for _ in range(n)]
    if rng.random() < 0.6:  # mostly grouped, as batches are
        codes.sort()
        for _ in range(rng.randint(0, 4)):
            if codes:
                i, j = rng.randrange(n), rng.randrange(n)
                codes[i], codes[j] = codes[j], codes[i]
    return codes


def test_grouping_moves_equal_the_python_ones():
    rng = random.Random(0)
    for _ in range(3000):
        codes = _random_codes(rng)
        assert rows.grouping_moves(codes) == grouping_moves_in_python(codes), codes


def test_grouping_moves_refuse_codes_out_of_range():
    for codes in ([0, 1, -1], [0, 1, 2**24], [0, 1, "a"]):
        with pytest.raises((IndexError, TypeError)):
            rows.grouping_moves(codes)


def test_grouping_steps_equal_the_python_ones():
    """Step after step (requests finishing, the runner condensing, requests
    entering, equal ids in new string objects, children of new families,
    the dicts forgotten past forget_after), the compiled step reads the same
    codes, decides the same moves and keeps the same batch as the Python
    one (FamilyGrouping without the kernels: group_in_python)."""
    rng = random.Random(4)
    for _ in range(60):
        forget_after = rng.choice([10, 40, 8192])
        known_c: dict[str, int] = {}
        families_c: dict[str, int] = {}
        compiled = rows.Grouping(M, known_c, families_c, forget_after)
        python = _python_grouping(forget_after)
        ids: list[str] = []
        for _ in range(30):
            finish_some(ids, rng, 3)  # the runner condenses
            ids += [f"r{rng.randrange(6)}" + f"{M}{rng.randrange(10**6)}" * rng.randrange(3)
                    for _ in range(rng.randint(0, 4))]
            if ids and rng.random() < 0.2:
                k = rng.randrange(len(ids))
                ids[k] = "".join(list(ids[k]))  # equal, another object
            want = python.moves(ids)
            assert compiled.moves(ids) == want
            assert compiled.seen == python._ids and compiled.codes() == python._codes
            assert (known_c, families_c) == (python._code_of_request, python._code_of_family)
            ids = list(python._ids)


def _python_grouping(forget_after: int):
    saved, native.rows = native.rows, None
    try:
        return FamilyGrouping(forget_after)
    finally:
        native.rows = saved


def test_grouping_refuses_and_keeps_its_batch():
    known: dict = {}
    compiled = rows.Grouping(M, known, {}, 8192)
    assert compiled.moves(["a", "b", "a"]) is not None
    before = (compiled.seen, compiled.codes())
    with pytest.raises(TypeError):  # not a request id
        compiled.moves(["a", 1, "b"])
    known["c"] = -5
    with pytest.raises(ValueError):  # a code out of range
        compiled.moves(["a", "c"])
    with pytest.raises(TypeError):
        compiled.moves(("a", "b"))
    assert (compiled.seen, compiled.codes()) == before


def _random_moves(rng: random.Random, n: int) -> tuple[list[int], list[int]]:
    moved = rng.sample(range(n), rng.randint(0, n))
    taken = list(moved)
    rng.shuffle(taken)
    return moved, taken


def _batch(n: int, width: int = 9):
    """Lists, token rows, whole-row arrays, counts and an index, as a batch
    has them."""
    keys = [f"id{i}" for i in range(n)]
    other = [object() for _ in range(n)]
    tokens = np.arange(n * width, dtype=np.int32).reshape(n, width)
    flags = (tokens % 3 == 0)
    whole = [np.arange(n, dtype=np.int64) - 7, np.linspace(0, 1, n, dtype=np.float32),
             np.arange(n) % 2 == 0, np.arange(n * 4, dtype=np.int32).reshape(n, 4)]
    counts = np.array([(i * 5) % (width - 2) for i in range(n)], dtype=np.int32)
    index = {k: i for i, k in enumerate(keys)}
    return keys, other, tokens, flags, whole, counts, index


def test_batch_rows_move_as_indexing_and_swaps_do():
    rng = random.Random(2)
    tag = object()
    for _ in range(300):
        n = rng.randint(1, 40)
        dst, src = _random_moves(rng, n)
        keys, other, tokens, flags, whole, counts, index = _batch(n)
        extra = rng.randint(0, 2)
        width = (int(counts[src].max()) if src else 0) + extra
        want = [list(keys), list(other), tokens.copy(), flags.copy(), [a.copy() for a in whole]]
        for values in want[:2]:
            old = list(values)
            for d, s_ in zip(dst, src):
                values[d] = old[s_]
        for a in want[2:4]:
            a[dst, :width] = a[src, :width]
        for a in want[4]:
            a[dst] = a[src]
        want_index = {**index, **{want[0][d]: d for d in dst}}
        some = {r: f"entry of {r}" for r in rng.sample(range(n), n // 3)}
        want_some = {r: v for r, v in some.items() if r not in dst}
        want_some.update({d: some[s_] for d, s_ in zip(dst, src) if s_ in some})
        moved: list = ["earlier"]
        batch = rows.BatchRows(lists=(keys, other), token_rows=(tokens, flags),
                               whole_rows=tuple(whole), counts=counts, index=index, keys=keys,
                               dicts=(some, {}))
        refs = [sys.getrefcount(x) for x in want[1]]
        batch.permute(dst, src, extra, moved, tag)
        assert [sys.getrefcount(x) for x in want[1]] == refs  # none leaked, none lost
        assert keys == want[0] and other == want[1] and index == want_index
        assert some == want_some
        np.testing.assert_array_equal(tokens, want[2])
        np.testing.assert_array_equal(flags, want[3])
        for a, b in zip(whole, want[4]):
            np.testing.assert_array_equal(a, b)
        # fixed points (a row taking itself) make no swap in either
        assert moved == ["earlier", *((i, j, tag) for i, j in moves_as_swaps((dst, src)))]


def test_batch_rows_without_a_record_and_with_int64_counts():
    keys, other, tokens, flags, whole, counts, index = _batch(6)
    batch = rows.BatchRows(lists=(keys,), token_rows=(tokens,), whole_rows=(),
                           counts=counts.astype(np.int64), index=index, keys=keys)
    batch.permute([0, 5], [5, 0], 0)  # no record asked
    assert keys[0] == "id5" and index["id5"] == 0


@pytest.mark.parametrize("dst, src, extra, error", [
    ([0, 1], [1, 1], 0, ValueError),    # a row taken twice
    ([0, 1], [1, 2], 0, ValueError),    # not one set of rows
    ([0, 0], [1, 0], 0, ValueError),    # a row given twice
    ([0, 1], [1], 0, ValueError),       # lengths differ
    ([0, -1], [-1, 0], 0, IndexError),
    ([0, 5], [5, 0], 0, IndexError),    # past the batch (its shortest list)
    ([0, 1], [1, 0], 9, ValueError),    # more tokens than a row holds
])
def test_batch_rows_refuse_and_change_nothing(dst, src, extra, error):
    keys, other, tokens, flags, whole, counts, index = _batch(6)
    del other[5:]  # one list is shorter: the batch holds 5 rows
    before = (list(keys), list(other), tokens.copy(), dict(index))
    batch = rows.BatchRows(lists=(keys, other), token_rows=(tokens,), whole_rows=tuple(whole),
                           counts=counts, index=index, keys=keys)
    moved: list = []
    with pytest.raises(error):
        batch.permute(dst, src, extra, moved, "swap")
    assert (keys, other, index, moved) == (before[0], before[1], before[3], [])
    np.testing.assert_array_equal(tokens, before[2])


def test_batch_rows_refuse_buffers_they_cannot_move():
    keys, other, tokens, flags, whole, counts, index = _batch(4)
    frozen = np.zeros(4, dtype=np.int32)
    frozen.flags.writeable = False
    for token_rows, whole_rows, counts_, error in [
        ((np.zeros(4, dtype=np.int32),), (), counts, ValueError),   # token rows are 2-D
        ((), (np.zeros((4, 2, 2), dtype=np.int32),), counts, ValueError),
        ((), (frozen,), counts, (BufferError, TypeError, ValueError)),
        ((), (), counts.astype(np.float32), TypeError),
    ]:
        with pytest.raises(error):
            rows.BatchRows(lists=(keys,), token_rows=token_rows, whole_rows=whole_rows,
                           counts=counts_, index=index, keys=keys)
