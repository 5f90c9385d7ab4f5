"""The pure decisions around a fork and a join (vllm_seqhooks.core.join_plan,
vllm_seqhooks.core.admission)."""

from __future__ import annotations

from vllm_seqhooks.config.special_kwargs import SpecialKwargs
from vllm_seqhooks.formats.tag_format_scanner import TagFormatScanner
from vllm_seqhooks.formats.text_codec import TextCodec
from vllm_seqhooks.core.join_plan import (
    child_budget,
    contribution,
    common_prefix,
    first_child_covers,
    fit_merge,
    promise_prompt,
    promise_prompt_len,
    resumes,
)
from vllm_seqhooks.config.presets import expand
from vllm_seqhooks.core.admission import request_hooks
from vllm_seqhooks.formats.request_scanner import request_scanner
from vllm_seqhooks.formats.promise import PromiseScanner

PROMISE = SpecialKwargs(sync_token_id=6, promise_token_id=4, promise_end_token_id=5)
TAGS = SpecialKwargs(**expand("threadweaver"))


def codec():
    return TextCodec([bytes([i]) for i in range(256)], lambda text: list(text.encode()))


def test_contribution_drops_the_stop_token_then_adds_merge_and_closing():
    tokens = [1, 2, 3, 10, 11, 2]  # prompt of 3, then 10 11 and EOS (2) at 5
    assert contribution(tokens, 3, 5) == [10, 11]
    assert contribution(tokens, 3, None) == [10, 11, 2]
    # A child that finished at its own join: its merge, then its end text.
    assert contribution(tokens, 3, 5, merged=[7, 7], closing=[9]) == [10, 11, 7, 7, 9]


def test_budget_merge_fit_and_resume():
    assert child_budget(None, 100, 30, 1000) == 70
    assert child_budget(None, 100, 100, 1000) == 1
    assert child_budget(8, 100, 30, 5) == 5
    assert fit_merge([1, 2, 3], 2) == ([1, 2], True)
    assert fit_merge([1, 2, 3], 3) == ([1, 2, 3], False)
    assert resumes(truncated=False, merged=3, room=10, remaining=5, family_stops=False)
    assert not resumes(truncated=False, merged=10, room=10, remaining=5, family_stops=False)
    assert not resumes(truncated=False, merged=3, room=10, remaining=0, family_stops=False)
    assert not resumes(truncated=False, merged=3, room=10, remaining=5, family_stops=True)


def test_first_child_covers_past_the_parent():
    # 16-token blocks; the child's last sampled token was never computed.
    assert first_child_covers(shared_tokens=49, child_tokens=49, parent_computed=40,
                              block_size=16)  # 48 > 40
    assert not first_child_covers(shared_tokens=48, child_tokens=48, parent_computed=40,
                                  block_size=16)  # 32
    assert not first_child_covers(shared_tokens=49, child_tokens=49, parent_computed=48,
                                  block_size=16)
    # Only the tokens the parent's resumed sequence shares with the child's
    # count: a merge re-tokenized from token 45 on reuses 32 of them.
    assert not first_child_covers(shared_tokens=45, child_tokens=60, parent_computed=40,
                                  block_size=16)
    assert first_child_covers(shared_tokens=45, child_tokens=60, parent_computed=20,
                              block_size=16)


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0


def test_promise_prompts():
    tokens = [1, 4, 20, 21, 5, 30]
    assert promise_prompt(PROMISE, tokens, 2, 4, 5) == [1, 4, 20, 21, 5]
    assert promise_prompt_len(PROMISE, 2, 4, 5) == 5
    templ = PROMISE.with_overrides(child_context="payload", child_prompt_prefix_token_ids=[9],
                                   child_prompt_suffix_token_ids=[8, 8])
    assert promise_prompt(templ, tokens, 2, 4, 5) == [9, 20, 21, 8, 8]
    assert promise_prompt_len(templ, 2, 4, 5) == 5


def test_request_hooks_and_scanners():
    rh = request_hooks(PROMISE, {"max_children_per_request": 3}, depth=0)
    assert (rh.may_spawn, rh.max_children, rh.child_max_tokens) == (True, 3, None)
    assert isinstance(request_scanner(PROMISE, rh, codec), PromiseScanner)
    child = request_hooks(PROMISE, {}, depth=1)  # max_child_depth 1
    assert not child.may_spawn and request_scanner(PROMISE, child, codec) is None
    # A tag format's child at the depth limit still ends at its end tag.
    tw_child = request_hooks(TAGS, {"child_max_tokens": 5}, depth=1)
    scanner = request_scanner(TAGS, tw_child, codec)
    assert isinstance(scanner, TagFormatScanner) and scanner.fork_index == -1
    assert tw_child.child_max_tokens == 5
    assert request_scanner(TAGS, request_hooks(TAGS, {"max_children_per_request": 0}, 0), codec) is None


def test_common_prefix_of_long_sequences():
    """Chunked comparison: the same answer as a token-by-token scan, for
    lists and tuples, a difference anywhere (also on chunk edges)."""
    import random

    from vllm_seqhooks.core.join_plan import common_prefix

    rng = random.Random(3)
    for _ in range(200):
        a = [rng.randrange(3) for _ in range(rng.choice([0, 5, 255, 256, 257, 900]))]
        b = list(a[:rng.randint(0, len(a))]) + [rng.randrange(3) for _ in range(rng.randint(0, 300))]
        want = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        assert common_prefix(a, b) == common_prefix(tuple(a), b) == want
