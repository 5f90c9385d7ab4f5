"""The fork-bomb scenario of the multi-user tests and benchmarks, on the
surgical harness (scripted tokens, no model; counted in engine steps).

One request writes ``fan_out`` promises and ``<sync>``; each child writes
``fan_out`` promises and ``<sync>``; each grandchild samples
``leaf_tokens`` tokens. Once the first level has spawned (the bomb wrote its ``<sync>``), a plain request
(hooks off) from another user is added; :func:`run_fork_bomb` counts the
steps it takes to finish, and what the bomb's family sampled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tests.support.sched_harness import (
    EOS_ID,
    PROMISE_END_ID,
    PROMISE_ID,
    SYNC_ID,
    SchedHarness,
    child_id,
)

BOMB_ID = "bomb"
PLAIN_ID = "plain"
PLAIN_PROMPT = (13, 14, 15)
BOMB_PROMPT = (10, 11, 12)


@dataclass
class ForkBombResult:
    #: Steps the plain request took from its arrival to its final output.
    plain_steps: int
    #: The same plain request's steps on an idle engine.
    plain_alone_steps: int
    #: Child requests the bomb's family spawned (all levels).
    descendants: int
    #: Tokens the bomb's descendants sampled (EOS included).
    descendant_sampled_tokens: int
    #: Tokens the whole family sampled (the bomb itself included).
    family_sampled_tokens: int
    bomb_finish_reason: Any
    harness: SchedHarness

    @property
    def slowdown(self) -> float:
        return self.plain_steps / self.plain_alone_steps


def promises(fan_out: int, first_payload: int) -> list[int]:
    """``fan_out`` one-token payloads in promise tags, then ``<sync>``."""
    out: list[int] = []
    for i in range(fan_out):
        out += [PROMISE_ID, first_payload + (i % 10), PROMISE_END_ID]
    return out + [SYNC_ID]


def bomb_scripts(fan_out: int, leaf_tokens: int) -> dict[str, list[int]]:
    scripts = {BOMB_ID: promises(fan_out, 30) + [EOS_ID]}
    for i in range(fan_out):
        child = child_id(BOMB_ID, i)
        scripts[child] = promises(fan_out, 40) + [EOS_ID]
        for j in range(fan_out):
            # Filler past the script's end: the grandchild samples until
            # its budget (or the script's EOS) stops it.
            scripts[child_id(child, j)] = [21] * (leaf_tokens - 1) + [EOS_ID]
    return scripts


def plain_alone_steps(async_scheduling: bool, plain_tokens: int = 32,
                      **engine: Any) -> int:
    h = SchedHarness(async_scheduling, check=False, **engine)
    h.add(PLAIN_ID, PLAIN_PROMPT, max_tokens=plain_tokens,
          extra_args={"seqhooks_enabled": False})
    return h.run(max_steps=10 * plain_tokens)


def run_fork_bomb(
    async_scheduling: bool = False,
    *,
    fan_out: int = 16,
    leaf_tokens: int = 200,
    bomb_max_tokens: int = 1000,
    plain_tokens: int = 32,
    bomb_extra_args: dict[str, Any] | None = None,
    bomb_priority: int = 0,
    plain_priority: int = 0,
    max_steps: int = 20000,
    **engine: Any,
) -> ForkBombResult:
    """Run the scenario; ``engine``: :func:`make_scheduler` arguments
    (``hooks`` for the server's settings, ``num_blocks``, ``max_num_seqs``,
    ``policy``, ...)."""
    engine.setdefault("num_blocks", 4096)
    engine.setdefault("max_model_len", 2048)
    hooks = dict(engine.pop("hooks", None) or {})
    hooks.setdefault("max_child_depth", 2)
    hooks.setdefault("max_children_per_request", fan_out)
    alone = plain_alone_steps(async_scheduling, plain_tokens, hooks=hooks, **engine)
    h = SchedHarness(async_scheduling, check=False, hooks=hooks,
                     scripts=bomb_scripts(fan_out, leaf_tokens), **engine)
    h.add(BOMB_ID, BOMB_PROMPT, max_tokens=bomb_max_tokens,
          extra_args=bomb_extra_args, priority=bomb_priority)
    # The plain request arrives once the bomb has written its promises and
    # <sync> (the first level has spawned).
    for _ in range(len(promises(fan_out, 0)) + 1):
        h.step()
    h.add(PLAIN_ID, PLAIN_PROMPT, max_tokens=plain_tokens,
          extra_args={"seqhooks_enabled": False}, priority=plain_priority)
    plain = h.run_until(lambda: PLAIN_ID in h.finish_reasons, max_steps=max_steps)
    h.run(max_steps=max_steps)
    trace = h.trace(BOMB_ID) or {}
    usage = trace.get("usage", {})
    bomb_sampled = len(h.tokens.get(BOMB_ID, ())) - usage.get("merged_tokens", 0)
    return ForkBombResult(
        plain_steps=plain,
        plain_alone_steps=alone,
        descendants=usage.get("num_children", 0),
        descendant_sampled_tokens=usage.get("children_sampled_tokens", 0),
        family_sampled_tokens=bomb_sampled + usage.get("children_sampled_tokens", 0),
        bomb_finish_reason=h.finish_reasons.get(BOMB_ID),
        harness=h,
    )


#: The server settings of "before": the behaviour before family limits.
LIMITS_OFF = {"fair_share": False, "family_token_factor": 10**6,
              "max_live_children_per_family": 10**6, "max_descendants": 10**6}


def main() -> None:
    """Print the fork-bomb table (steps counted; sync scheduling)::

        .venv/bin/python -m tests.support.fork_bomb
    """
    print("| grandchild tokens | limits | plain alone | beside the bomb | × "
          "| descendants | descendants' sampled tokens |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for leaf in (200, 800):
        for name, hooks in (("off", LIMITS_OFF), ("on", {})):
            r = run_fork_bomb(False, leaf_tokens=leaf, hooks=dict(hooks))
            print(f"| {leaf} | {name} | {r.plain_alone_steps} | {r.plain_steps} "
                  f"| {r.slowdown:.1f} | {r.descendants} | {r.descendant_sampled_tokens:,} |",
                  flush=True)


if __name__ == "__main__":
    main()
