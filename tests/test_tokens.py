"""PromiseScanner: the hook-token state machine."""

from vllm_seqhooks.formats.events import PayloadClosed, PromiseIgnored, SyncReached
from vllm_seqhooks.formats.promise import PromiseScanner

P, E, S = 4, 5, 6


def test_plain_tokens_make_no_events():
    sp = PromiseScanner(S, P, E)
    assert sp.feed([10, 11, 12], 0) == []
    assert not sp.payload_open


def test_payload_closed_by_end_token():
    sp = PromiseScanner(S, P, E)
    # positions:     3  4   5   6  7
    ev = sp.feed([P, 10, 11, E, 12], 3)
    assert ev == [PayloadClosed(start=4, end=6, context_end=7, closed_by="promise_end")]


def test_payload_split_over_steps():
    sp = PromiseScanner(S, P, E)
    assert sp.feed([P], 0) == []
    assert sp.payload_open
    assert sp.feed([10], 1) == []
    assert sp.feed([E], 2) == [PayloadClosed(1, 2, 3, "promise_end")]


def test_without_end_token_next_promise_or_sync_closes():
    sp = PromiseScanner(S, P, None)
    ev = sp.feed([P, 10, P, 11, 12, S], 0)
    assert ev == [
        PayloadClosed(1, 2, 2, "promise"),
        PayloadClosed(3, 5, 5, "sync"),
        SyncReached(5),
    ]


def test_finish_closes_open_payload():
    sp = PromiseScanner(S, P, None)
    sp.feed([P, 10, 11], 7)
    assert sp.finish(10) == [PayloadClosed(8, 10, 10, "finish")]
    assert sp.finish(10) == []


def test_end_token_outside_payload_is_plain_text():
    sp = PromiseScanner(S, P, E)
    assert sp.feed([E, 10], 0) == []


def test_sync_closes_unterminated_payload_even_with_end_token():
    sp = PromiseScanner(S, P, E)
    assert sp.feed([P, 10, S], 0) == [PayloadClosed(1, 2, 2, "sync"), SyncReached(2)]


def test_promise_limit():
    sp = PromiseScanner(S, P, E, max_promises=1)
    ev = sp.feed([P, 10, E, P, 11, E], 0)
    assert ev == [PayloadClosed(1, 2, 3, "promise_end"),
                  PromiseIgnored(3, "max_children_per_request")]
    assert not sp.payload_open


def test_sync_without_payload():
    sp = PromiseScanner(S, P, E)
    assert sp.feed([10, S], 4) == [SyncReached(5)]
