"""The declared semantics of a KV-splice join (core/splice_layout.py)
against what Multiverse's, NPR's and Parallel-R1's trainers compute for the same merged
sequence (testing/training_masks.py, re-implemented from their code).

Found by these tests: with the presets' texts (a ``\\n`` lead before each
path's header, ``\\n`` between paths, a suffix starting with ``\\n``) no
engine can match training, because in training the ``\\n`` between two
paths lies outside both paths and carries the earlier path into the later
one; with no lead, no separator and the suffix without its leading ``\\n``
the trainers' mask and positions equal a splice exactly."""

from __future__ import annotations

import random

import pytest

from vllm_seqhooks.core.splice_layout import (
    Parallel,
    attention_mask,
    extent,
    positions,
    token_count,
)
from tests.support.training_masks import (
    multiverse_training_layout,
    npr_training_layout,
    parallel_r1_training_layout,
)

NL, COLON, IM_END = 1, 2, 3
MV = {name: 10 + k for k, name in enumerate(
    ["Parallel", "/Parallel", "Goal", "/Goal", "Path", "/Path", "Conclusion", "/Conclusion"])}
NPR = {"im_end": IM_END, **{name: 30 + k for k, name in enumerate(
    ["guideline", "/guideline", "step", "/step", "takeaway"])}}
DIGIT = 50  # DIGIT + n: the label n


def filler(rng: random.Random, low: int, high: int) -> list[int]:
    return [rng.randrange(100, 200) for _ in range(rng.randint(low, high))]


def test_layout_arithmetic():
    layout = (3, Parallel(((2,), (4, Parallel(((1,), (3,))), 1))), 2)
    assert token_count(layout) == 3 + 2 + 4 + 1 + 3 + 1 + 2
    assert extent(layout) == 3 + max(2, 4 + 3 + 1) + 2
    assert positions(layout) == [0, 1, 2, 3, 4, 3, 4, 5, 6, 7, 7, 8, 9, 10, 11, 12]
    mask = attention_mask(layout)
    second_path_start = 5
    assert not any(mask[i][3] or mask[i][4] for i in range(second_path_start, 14))
    assert mask[14][3] and mask[14][10] and mask[15][13]  # after the fork: everything
    inner_second = 10
    assert not mask[inner_second][9] and mask[inner_second][8]  # siblings hidden, parent seen


def test_one_path_is_plain_causal_generation():
    layout = (5, Parallel(((7,),)), 4)
    assert positions(layout) == list(range(16))
    assert attention_mask(layout) == [[j <= i for j in range(16)] for i in range(16)]


# ---------------------------------------------------------------- Multiverse
def mv_family(rng, lead, suffix, depth=0):
    """(ids, layout) of a Multiverse block as a splice lays it out: the
    context up to ``</Goal>``, each path (lead + header + body + ``</Path>``),
    then the suffix, the conclusion and ``</Parallel>``."""
    prefix = [MV["Parallel"], NL, MV["Goal"], *filler(rng, 0, 6), MV["/Goal"]]
    ids, paths = list(prefix), []
    for n in range(1, rng.randint(1, 4) + 1):
        head = [*lead, MV["Path"], NL, DIGIT + n, COLON, *filler(rng, 0, 9)]
        if depth < 2 and rng.random() < 0.3:
            inner_ids, inner_layout = mv_family(rng, lead, suffix, depth + 1)
            tail = [*filler(rng, 0, 4), MV["/Path"]]
            ids += head + inner_ids + tail
            paths.append((len(head), *inner_layout, len(tail)))
        else:
            body = head + [MV["/Path"]]
            ids += body
            paths.append((len(body),))
    rest = [*suffix, *filler(rng, 1, 6), MV["/Conclusion"], NL, MV["/Parallel"]]
    return ids + rest, (len(prefix), Parallel(tuple(paths)), len(rest))


def mv_sequence(rng, lead, suffix):
    head = filler(rng, 1, 40)
    ids, layout = mv_family(rng, lead, suffix)
    tail = filler(rng, 0, 10)
    return head + ids + tail, (len(head), *layout, len(tail))


def test_multiverse_training_equals_a_splice_without_newlines_around_paths():
    rng = random.Random(0)
    nested = 0
    for _ in range(60):
        ids, layout = mv_sequence(rng, lead=[], suffix=[MV["Conclusion"], NL])
        mask, pos = multiverse_training_layout(ids, MV)
        assert token_count(layout) == len(ids)
        assert pos == positions(layout)
        assert mask == attention_mask(layout)
        nested += str(layout).count("Parallel") > 1
    assert nested >= 5  # nesting was exercised


def test_multiverse_preset_texts_cannot_match_training():
    """The three places the ``multiverse`` preset's texts differ from
    training, on the merged sequence ``</Goal>\\n<Path>..</Path>\\n<Path>..
    </Path>\\n<Conclusion>\\n``."""
    prefix = [7, 7, MV["Parallel"], MV["Goal"], 9, MV["/Goal"]]
    path1 = [NL, MV["Path"], NL, DIGIT + 1, COLON, 101, 102, MV["/Path"]]
    path2 = [NL, MV["Path"], NL, DIGIT + 2, COLON, 103, 104, 105, MV["/Path"]]
    rest = [NL, MV["Conclusion"], NL, 104, MV["/Conclusion"], MV["/Parallel"]]
    ids = prefix + path1 + path2 + rest
    layout = (len(prefix), Parallel(((len(path1),), (len(path2),))), len(rest))
    mask, pos = multiverse_training_layout(ids, MV)
    goal_end = len(prefix) - 1
    lead1, sep, suffix_nl = len(prefix), len(prefix) + len(path1), len(prefix) + len(path1) + len(path2)
    # 1. the lead after </Goal> and the first <Path> share a position in training
    assert pos[lead1] == pos[lead1 + 1] == pos[goal_end] + 1
    # 2. the \n between the paths is outside both: it sees path 1 and path 2 sees it
    assert mask[sep][lead1 + 5] and mask[sep + 1][sep]
    # 3. the suffix's positions are not consecutive: after a last path that is
    #    the longest, its \n and <Conclusion> share a position
    assert pos[suffix_nl + 1] == pos[suffix_nl]
    assert (pos, mask) != (positions(layout), attention_mask(layout))


# ---------------------------------------------------------------------- NPR
def npr_sequence(rng, lead, suffix):
    head = [*filler(rng, 1, 20), IM_END, *filler(rng, 0, 5)]
    prefix = [NPR["guideline"], *filler(rng, 0, 6), NPR["/guideline"]]
    paths, body = [], []
    for n in range(1, rng.randint(1, 4) + 1):
        step = [*lead, NPR["step"], NL, DIGIT + n, COLON, *filler(rng, 0, 9), NPR["/step"]]
        body += step
        paths.append((len(step),))
    rest = [*suffix, *filler(rng, 1, 8)]
    ids = head + prefix + body + rest
    return ids, (len(head) + len(prefix), Parallel(tuple(paths)), len(rest))


def test_npr_training_equals_a_splice_without_newlines_around_steps():
    rng = random.Random(2)
    for _ in range(60):
        ids, layout = npr_sequence(rng, lead=[], suffix=[NPR["takeaway"], NL])
        mask, pos = npr_training_layout(ids, NPR)
        assert pos == positions(layout)
        assert mask == attention_mask(layout)


def test_npr_preset_texts_cannot_match_training():
    rng = random.Random(3)
    differ = 0
    for _ in range(20):
        ids, layout = npr_sequence(rng, lead=[NL], suffix=[NL, NPR["takeaway"], NL])
        mask, pos = npr_training_layout(ids, NPR)
        differ += (pos, mask) != (positions(layout), attention_mask(layout))
    assert differ == 20


def test_npr_trainer_rejects_nested_steps():
    ids = [5, IM_END, NPR["guideline"], NPR["/guideline"], NPR["step"], NPR["step"],
           NPR["/step"], NPR["/step"], NPR["takeaway"]]
    with pytest.raises(ValueError):
        npr_training_layout(ids, NPR)


# ---------------------------------------------------------------- Parallel-R1
PR1 = {name: 60 + k for k, name in enumerate(["Parallel", "/Parallel", "Path", "/Path",
                                               "Summary", "/Summary"])}


def parallel_r1_sequence(rng, paths: int, separator=()):
    """The ``parallel-r1`` preset's merge as a splice lays it out: the fork
    tag ``<Parallel>``, each path ``<Path>`` ... ``</Path>`` (the child's
    header, output and end tag), the suffix ``</Parallel>\n<Summary>``."""
    prefix = [*filler(rng, 1, 40), PR1["Parallel"]]
    body, laid = [], []
    for n in range(paths):
        path = [PR1["Path"], *filler(rng, 0, 12), PR1["/Path"]]
        body += [*(separator if n else ()), *path]
        laid.append((len(path) + (len(separator) if n else 0),))
    rest = [PR1["/Parallel"], NL, PR1["Summary"], *filler(rng, 1, 8), PR1["/Summary"]]
    ids = prefix + body + rest
    return ids, (len(prefix), Parallel(tuple(laid)), len(rest))


def test_parallel_r1_training_equals_the_presets_splice():
    """The preset's texts (no lead, no separator, the suffix starting with
    ``</Parallel>``) give exactly Parallel-R1's training mask and
    positions, for the two paths its trainer was run with and for more."""
    rng = random.Random(4)
    for _ in range(60):
        ids, layout = parallel_r1_sequence(rng, rng.randint(1, 4))
        mask, pos = parallel_r1_training_layout(ids, PR1)
        assert pos == positions(layout)
        assert mask == attention_mask(layout)


def test_parallel_r1_training_differs_with_a_separator_between_paths():
    """A token between two paths is outside both in training: it sits at
    position 0 there, and the later path sees the earlier through it."""
    rng = random.Random(5)
    ids, layout = parallel_r1_sequence(rng, 2, separator=[NL])
    mask, pos = parallel_r1_training_layout(ids, PR1)
    sep = ids.index(NL)
    assert pos[sep] == 0 and mask[sep][sep - 1] and mask[sep + 1][sep]
    assert (pos, mask) != (positions(layout), attention_mask(layout))
