"""What the workers do for splice joins before a step's forward pass (the
data the scheduler sends them with the step; pure, no vLLM import).

A splice join gives the parent the KV its children computed: the KV of
each path's tokens is copied, slot by slot, from the child's cache blocks
into the parent's, before the step in which the parent goes on (so that
step's forward pass reads it). The parent then holds more tokens than
positions (:func:`vllm_seqhooks.core.splice_layout.extent`): its
positions run behind its token indices, by shifts the model runner adds
to the positions of the tokens the request computes in the step (their KV
slots stay the ones their indices give):
:meth:`vllm_seqhooks.core.splice_map.SpliceMap.step_runs`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm_seqhooks.core.splice_map import StepRuns


@dataclass
class SpliceInputs:
    """One step's splice work: copy the KV of cache slots ``copy_from`` to
    ``copy_to`` (same length, every layer), and shift the positions of
    request ``r``'s tokens in this step by ``position_shift[r]``: (offset,
    shift) pairs, each shift applying from its offset among the request's
    tokens of the step to the next pair's."""

    copy_from: list[int] = field(default_factory=list)
    copy_to: list[int] = field(default_factory=list)
    position_shift: dict[str, StepRuns] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.copy_from) != len(self.copy_to):
            raise ValueError(f"{len(self.copy_from)} slots to copy from, "
                             f"{len(self.copy_to)} to copy to")

    def __bool__(self) -> bool:
        return bool(self.copy_from or self.position_shift)
