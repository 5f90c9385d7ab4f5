"""A persistent batch's churn for the family grouping's tests: requests
finish and vLLM's ``InputBatch.condense`` moves the last row into each hole."""

from __future__ import annotations

import random


def finish_some(ids: list[str], rng: random.Random, most: int) -> None:
    """Finish up to ``most`` random requests of ``ids`` (in place), each hole
    taken by the last row, as the V1 runner's condense does."""
    for _ in range(rng.randint(0, most)):
        if ids:
            hole = rng.randrange(len(ids))
            last = ids.pop()
            if hole < len(ids):
                ids[hole] = last
