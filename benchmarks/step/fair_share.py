"""Workload ``fair_share``: what fair share costs the scheduler per step,
without a model.

``python -m benchmarks.step --workload fair_share [--sizes 64 256 512]
[--repeats 5]``

The workload fair share works hardest on: a batch given at once, as an RL
step's GRPO groups are (``2 x slots`` families, each a 100-token prompt that
forks 4 children of 30-49 tokens and then writes 20 more), on an engine with
``slots`` running slots (``--sizes``). While the batch lasts, children of
started families wait beside roots that have not started, so every step
works out a share. Driven by the surgical harness (``tests.support``): every
scheduled request samples its script's token; only ``schedule()`` and
``update_from_output()`` are timed, for every configuration alike, over the
whole run (every family to its end).

Configurations:

* ``fair-share``: hooks with fair share on (the default);
* ``no-fair-share`` and ``no-fair-share-b``: the same with fair share off,
  twice (the A/A control: their ratio is the noise).

Reported per configuration: scheduler µs per scheduled request-step and per
step (medians), and, for ``fair-share``, the µs per step spent in fair share
itself (working out the step's share, and the holds asked as admission
reaches waiting children). The ratio ``fair-share / no-fair-share`` is what
fair share costs.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from benchmarks.step.harness import (
    Options, fork_round, header, repeat_sizes, spreads, table, timed_step)

TITLE = "What fair share costs the scheduler per step"
SIZES = "slots"
DEFAULT_SIZES = [64, 256, 512]
CONFIGS = ("fair-share", "no-fair-share", "no-fair-share-b")
KEYS = ("us_per_request_step", "us_per_step", "fair_share_us_per_step", "steps",
        "scheduled_per_step", "preemptions")
CHILDREN = 4
PROMPT = 100
CONTINUATION = 20


def harness(config: str, slots: int):
    from tests.support.sched_harness import SchedHarness, child_id
    from vllm_seqhooks.scripted.tiny_model import EOS_ID

    h = SchedHarness(False, num_blocks=slots * 12 + 64, block_size=32, max_num_seqs=slots,
                     max_model_len=400, max_num_batched_tokens=max(2048, slots * 2),
                     check=False, hooks={
                         "max_children_per_request": CHILDREN,
                         "fair_share": config == "fair-share",
                         "max_live_children": 1 << 20, "max_descendants": 2 * CHILDREN})
    script = fork_round([40], CHILDREN) + [50] * CONTINUATION + [EOS_ID]
    for i in range(2 * slots):
        rid = f"r{i}"
        h.add(rid, [10 + i % 50] * PROMPT, script=script, max_tokens=len(script))
        for j in range(CHILDREN):
            h.scripts[child_id(rid, j)] = [60 + j] * (30 + (i + j) % 20) + [EOS_ID]
    return h


def _timed(obj: Any, name: str, spent: list[float]) -> None:
    """Add the seconds of ``obj.name`` (on the instance) to ``spent[0]``."""
    inner = getattr(obj, name, None)
    if inner is None:
        return

    def timed(*args: Any, **kwargs: Any):
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t0

    setattr(obj, name, timed)


def measure(config: str, slots: int) -> dict[str, float]:
    h = harness(config, slots)
    sched = h.sched
    fair = [0.0]
    if config == "fair-share":
        _timed(sched.fair_share, "hold_over_share", fair)
        _timed(sched.fair_share, "holds_back", fair)
    gc.collect()
    seconds, steps, scheduled = 0.0, 0, 0
    while sched.requests:
        s, n = timed_step(h)
        seconds += s
        steps += 1
        scheduled += n
        if steps > 10_000:
            raise RuntimeError(f"{config} at {slots} slots: no end")
    return {"us_per_request_step": 1e6 * seconds / scheduled, "us_per_step": 1e6 * seconds / steps,
            "fair_share_us_per_step": 1e6 * fair[0] / steps, "steps": steps,
            "scheduled_per_step": scheduled / steps,
            "preemptions": sched.hook_stats.get("fair_share_preemptions", 0)}


def run(opts: Options, log=print) -> dict[str, Any]:
    runs = repeat_sizes(opts.sizes, CONFIGS, opts.repeats,
                        lambda c, slots, _r: measure(c, slots),
                        warm_up=measure, log=log)
    return {"sizes": opts.sizes, "repeats": opts.repeats,
            "points": {str(slots): {c: spreads(rs, KEYS) for c, rs in by_config.items()}
                       for slots, by_config in runs.items()}}


def report(results: dict[str, Any], command: str, env: dict[str, Any]) -> str:
    lines = header(TITLE, "fair_share", command, env, (
        f"Median of {results['repeats']} interleaved repeats; a batch of 2 × slots "
        "families given at once; scheduler µs (`schedule()` + `update_from_output()`) "
        "per scheduled request-step over the whole run."))
    rows = []
    for slots, point in results["points"].items():
        on, off, off_b = ({k: s["median"] for k, s in point[c].items()} for c in CONFIGS)
        rows.append([
            slots, f"{on['us_per_request_step']:.2f}", f"{off['us_per_request_step']:.2f}",
            f"{off_b['us_per_request_step']:.2f}",
            f"{on['us_per_request_step'] / off['us_per_request_step']:.2f}",
            f"{off_b['us_per_request_step'] / off['us_per_request_step']:.2f}",
            f"{on['fair_share_us_per_step']:.0f}", f"{on['us_per_step']:.0f}",
            f"{on['steps']:.0f}", f"{on['preemptions']:.0f}"])
    lines += table(["slots", "fair-share µs", "no-fair-share µs", "no-fair-share-b µs",
                    "fair-share / no-fair-share", "A/A (no-fair-share-b / no-fair-share)",
                    "fair share itself, µs per step", "scheduler µs per step (fair-share)",
                    "steps", "fair-share preemptions"], rows)
    return "\n".join(lines) + "\n"
