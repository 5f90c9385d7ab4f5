"""How long one engine step's forward pass takes on a GPU: a roofline.

Pure (imports no vLLM, no torch). A step is the list of its requests, each
as ``(scheduled_tokens, context_after)``: the tokens the step computes for
the request and the request's length once they are in the KV cache. Then

    bytes  = weights once (not the input embedding table) + the KV every request's attention reads
             (its context) + the KV the step writes
    flops  = 2 x matmul parameters x scheduled tokens
             + 2 x hidden x vocab per sampled row (the LM head)
             + attention: 4 x layers x heads x head_dim per (query, key) pair
    time   = max(bytes / (HBM bandwidth x e_bw),
                 flops / (dense BF16 throughput x e_flops))
             + fixed overhead per step

``e_bw``, ``e_flops`` and the overhead are calibrated per GPU and model on
published vLLM figures (:mod:`.profiles`, docs/benchmarks/gpu_timed.md).
Left out: kernel-launch variance, CUDA-graph padding to captured batch
sizes, the sampler's cost, tensor parallelism.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Gpu:
    name: str
    hbm_bytes_per_s: float
    dense_bf16_flops: float


@dataclass(frozen=True)
class Model:
    """A dense decoder in BF16 (2 bytes a parameter and a KV element)."""

    name: str
    params: float            # all parameters, embeddings included
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool
    dtype_bytes: int = 2

    @property
    def weight_bytes(self) -> float:
        """Bytes a step streams: every weight but the input embedding table
        (only the rows looked up are read), unless it is also the LM head."""
        embed = 0 if self.tied_embeddings else self.vocab * self.hidden
        return (self.params - embed) * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def matmul_params(self) -> float:
        """Parameters multiplied per token: all but the embedding table
        (a lookup) and the LM head (counted per sampled row)."""
        embed = self.vocab * self.hidden
        return self.params - (embed if self.tied_embeddings else 2 * embed)


@dataclass(frozen=True)
class Calibration:
    bandwidth_efficiency: float
    flops_efficiency: float
    overhead_s: float


@dataclass(frozen=True)
class StepCost:
    """One step's roofline terms and its modelled time."""

    bytes: float
    flops: float
    memory_s: float
    compute_s: float
    seconds: float


@dataclass(frozen=True)
class StepModel:
    gpu: Gpu
    model: Model
    calibration: Calibration

    def cost(self, batch: Iterable[tuple[int, int]], sampled_rows: int | None = None) -> StepCost:
        """The cost of a step that schedules ``batch`` (``(scheduled,
        context_after)`` per request); ``sampled_rows`` defaults to one row
        per request."""
        m = self.model
        tokens = kv_read = rows = 0
        pairs = 0.0
        for scheduled, context in batch:
            if scheduled <= 0:
                continue
            tokens += scheduled
            kv_read += context
            rows += 1
            # Query i of the chunk sees the context before the chunk plus
            # itself and the chunk's earlier tokens (causal).
            pairs += scheduled * (context - scheduled) + scheduled * (scheduled + 1) / 2
        if tokens == 0:
            return StepCost(0.0, 0.0, 0.0, 0.0, 0.0)
        rows = rows if sampled_rows is None else sampled_rows
        nbytes = m.weight_bytes + (kv_read + tokens) * m.kv_bytes_per_token
        flops = (2 * m.matmul_params * tokens + 2 * m.hidden * m.vocab * rows
                 + 4 * m.layers * m.heads * m.head_dim * pairs)
        c = self.calibration
        memory_s = nbytes / (self.gpu.hbm_bytes_per_s * c.bandwidth_efficiency)
        compute_s = flops / (self.gpu.dense_bf16_flops * c.flops_efficiency)
        return StepCost(nbytes, flops, memory_s, compute_s,
                        max(memory_s, compute_s) + c.overhead_s)

    def seconds(self, batch: Iterable[tuple[int, int]]) -> float:
        return self.cost(batch).seconds
