"""The wall clock the ranks of an SPMD engine read alike.

With ``distributed_executor_backend="external_launcher"`` (verl's rollout
workers) every rank runs its own scheduler on the same requests, and their
batches must stay identical (each step's model runner calls collectives).
Timeouts are the only hook decisions that read the clock, and two ranks'
clocks never agree to the step: one rank would cut a child that the other
lets finish. :class:`AgreedClock` makes each reading the latest of the
ranks' own (an all-reduce over the engine's CPU process group), so every
rank compares its deadlines with the same time.

It is a collective: every rank must read it at the same points. The
scheduler reads it only where its decisions so far (identical on every
rank) and the request's own settings (the same on every rank) say so: when
a family with a timeout is created (its deadline starts at the latest of
the ranks' arrival times), when a child of a family with a child timeout is
spawned, and at the steps where deadlines are pending.
"""

from __future__ import annotations

import time


def spmd_engine(vllm_config) -> bool:
    """An SPMD engine: every rank runs its own scheduler on the same
    requests (``distributed_executor_backend="external_launcher"``, as verl's
    rollout workers do) and must take the same decisions."""
    return vllm_config.parallel_config.distributed_executor_backend == "external_launcher"


class AgreedClock:
    """``time.time()``, agreed between the ranks of an SPMD engine."""

    def __init__(self, group=None) -> None:
        #: The process group (None: vLLM's world CPU group, looked up at the
        #: first reading, when the ranks' groups exist).
        self._group = group

    def __call__(self) -> float:
        return self.agree(time.time())

    def agree(self, value: float) -> float:
        """The largest of the ranks' ``value`` (each rank gives its own)."""
        import torch
        import torch.distributed as dist

        if self._group is None:
            from vllm_seqhooks.engine import vllm_private

            self._group = vllm_private.world_cpu_group()
        reading = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(reading, op=dist.ReduceOp.MAX, group=self._group)
        return float(reading.item())

