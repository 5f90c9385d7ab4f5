"""Parallel-reasoning traces in ThreadWeaver's format, with ThreadWeaver's
published lengths: what the GPU-timed benchmark's families write.

ThreadWeaver (arXiv 2512.07843), Appendix C, Table 8, self-train set:
4.00 parallel blocks per trace, 2.46 threads per block, 969 tokens per
thread, 2,458 tokens per block, 11,176 tokens per trace, 9,153 on the
critical path (the longest thread of each block plus what is sequential).
Drawn here: blocks per trace as published; 2 or 3 threads per block (3 with
probability 0.46: the mean 2.46); thread lengths lognormal with the
published mean and sigma 1.4, capped at 16 times the mean, which puts the
mean longest thread of a block (Table 8: (9,153 - 1,344) / 4 - 74 = 1,878
tokens) within 6 % of it; the sequential text between blocks 1,344 / 5
tokens a segment; the outline 74 tokens a block. The draw's means (thread,
longest thread, total, critical path) are within 6 % of Table 8's
(tests/test_gpu_timed.py). Every length is multiplied by ``scale`` (the grid's
families are shorter than the paper's, to run in minutes; joins then come
more often per token, which does not favour native).

Pure (no vLLM): a :class:`Trace` is lengths; :func:`trace_text` writes it
in ThreadWeaver's tags with the tiny model's one-character tokens.
"""

from __future__ import annotations

import math
import random
import string
from dataclasses import dataclass

TABLE8 = dict(blocks=4, threads_per_block=2.46, tokens_per_thread=969,
              tokens_per_block=2458, total=11176, critical_path=9153)
THREAD_SIGMA = 1.4
THREAD_CAP = 16  # x the mean: bounds the context (max_model_len)
_SEQUENTIAL = (TABLE8["total"] - TABLE8["blocks"] * TABLE8["tokens_per_block"]) / (
    TABLE8["blocks"] + 1)
_OUTLINE = TABLE8["tokens_per_block"] - TABLE8["threads_per_block"] * TABLE8["tokens_per_thread"]
_LETTERS = string.ascii_lowercase + "    "
#: What the engine (and ThreadWeaver's loop) writes after a block's merged
#: threads (the format's merge suffix).
MERGE_SUFFIX = "\n<Conclusion>\n"


@dataclass(frozen=True)
class Trace:
    sequential: tuple[int, ...]          # one more than blocks
    blocks: tuple[tuple[int, ...], ...]  # thread lengths per block
    outline: int                         # tokens of each block's outline

    @property
    def total_tokens(self) -> int:
        return sum(self.sequential) + sum(sum(b) + self.outline for b in self.blocks)

    @property
    def critical_path_tokens(self) -> int:
        return sum(self.sequential) + sum(max(b) + self.outline for b in self.blocks)


def _lognormal(rng: random.Random, mean: float, sigma: float) -> float:
    return rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)


def draw_trace(rng: random.Random, *, scale: float = 1.0, blocks: int | None = None) -> Trace:
    n = TABLE8["blocks"] if blocks is None else blocks
    mean = TABLE8["tokens_per_thread"] * scale
    cap = THREAD_CAP * mean
    block_list = []
    for _ in range(n):
        k = 3 if rng.random() < TABLE8["threads_per_block"] - 2 else 2
        block_list.append(tuple(max(4, min(round(cap), round(_lognormal(rng, mean, THREAD_SIGMA))))
                                for _ in range(k)))
    seq = tuple(max(4, round(_SEQUENTIAL * scale)) for _ in range(n + 1))
    return Trace(seq, tuple(block_list), max(8, round(_OUTLINE * scale)))


@dataclass(frozen=True)
class TraceText:
    """What the parent samples (its whole script: it resumes after each
    join where it stopped) and each child, by key (promise order, counted
    over all the parent's blocks), and the same trace written sequentially
    (one request writes every thread in turn: the anchors' baseline)."""

    parent: str
    children: dict[str, str]
    sequential: str


def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(_LETTERS) for _ in range(n))


def trace_text(trace: Trace, rng: random.Random) -> TraceText:
    """ThreadWeaver's tags: ``<Parallel>\\n<Outlines>\\n<Outline>1: ...
    </Outline>...</Outlines>``, then each thread ``<Thread>\\n{i}:`` (the
    header the engine writes) ``...</Thread>``, then ``</Parallel>`` and the
    sequential text. The sequential text is the merged one: what the engine
    returns for the family (threads as it joins them, the merge suffix)."""
    parent, sequential, children = [], [], {}
    seq = [_text(rng, n) for n in trace.sequential]
    parent.append(seq[0])
    sequential.append(seq[0])
    for b, threads in enumerate(trace.blocks):
        per_item = max(1, trace.outline // len(threads) - len("<Outline>1: </Outline>\n"))
        outline = "".join(f"<Outline>{i + 1}: {_text(rng, per_item)}</Outline>\n"
                          for i in range(len(threads)))
        fork = "<Parallel>\n<Outlines>\n" + outline + "</Outlines>"
        parent.append(fork)
        sequential.append(fork)
        for i, n in enumerate(threads):
            body = _text(rng, n)
            children[str(len(children))] = body + "</Thread>"
            sequential.append(f"{'' if i else chr(10)}<Thread>\n{i + 1}:{body}</Thread>")
        parent.append("</Parallel>\n" + seq[b + 1])
        sequential.append(MERGE_SUFFIX + "</Parallel>\n" + seq[b + 1])
    return TraceText("".join(parent), children, "".join(sequential))
