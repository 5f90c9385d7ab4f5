"""KV blocks as the scheduler counts them (pure, no vLLM import)."""

from __future__ import annotations


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks that ``tokens`` tokens fill (the last one partly)."""
    return -(-max(0, tokens) // block_size)
