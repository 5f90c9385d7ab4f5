"""KV blocks as the scheduler counts them (pure, no vLLM import)."""

from __future__ import annotations


def blocks_holding(num_tokens: int, block_size: int) -> int:
    """Blocks that hold ``num_tokens`` tokens from a request's start."""
    return -(-num_tokens // block_size)


def blocks_to_start(num_tokens: int, num_computed_tokens: int, block_size: int) -> int:
    """Blocks a waiting request takes to be scheduled: its tokens not yet
    computed plus the one it samples. An upper bound: prefix-cache hits on
    blocks other requests hold take no free block."""
    return blocks_holding(max(0, num_tokens - num_computed_tokens + 1), block_size)
