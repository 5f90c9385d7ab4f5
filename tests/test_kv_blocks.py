"""How the scheduler counts KV blocks (core/kv_blocks.py)."""

from vllm_seqhooks.core.kv_blocks import blocks_holding, blocks_to_start


def test_blocks_holding_a_request_start():
    assert [blocks_holding(n, 16) for n in (0, 1, 15, 16, 17, 32, 33)] == [0, 1, 1, 1, 2, 2, 3]


def test_blocks_to_start_count_the_uncomputed_tokens_and_the_sampled_one():
    assert blocks_to_start(40, 0, 16) == 3
    assert blocks_to_start(40, 32, 16) == 1  # 8 tokens + the sampled one
    assert blocks_to_start(40, 40, 16) == 1
    assert blocks_to_start(40, 50, 16) == 0  # nothing left to compute
