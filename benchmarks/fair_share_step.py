"""What fair share costs the scheduler per step, without a model.

``python -m benchmarks.fair_share_step [--slots 64 256 512] [--repeats 5]
[--out docs/benchmarks]``

The workload fair share works hardest on: a batch given at once, as an RL
step's GRPO groups are (``2 x slots`` families, each a 100-token prompt that
forks 4 children of 30-49 tokens and then writes 20 more), on an engine with
``slots`` running slots. While the batch lasts, children of started
families wait beside roots that have not started, so every step works out
a share. Driven by the surgical harness (``tests.support``): every
scheduled request samples its script's token; only ``schedule()`` and
``update_from_output()`` are timed, for every configuration alike, over the
whole run (every family to its end).

Configurations, run interleaved (``benchmarks.common.interleaved``) after a
discarded warm-up of each:

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

import argparse
import gc
import statistics
import time
from pathlib import Path
from typing import Any

CONFIGS = ("fair-share", "no-fair-share", "no-fair-share-b")
CHILDREN = 4
PROMPT = 100
CONTINUATION = 20


def _harness(config: str, slots: int):
    from tests.support.sched_harness import (
        EOS_ID, PROMISE_END_ID, PROMISE_ID, SYNC_ID, SchedHarness, child_id)

    h = SchedHarness(False, num_blocks=slots * 12 + 64, block_size=32, max_num_seqs=slots,
                     max_model_len=400, max_num_batched_tokens=max(2048, slots * 2),
                     check=False, hooks={
                         "max_children_per_request": CHILDREN,
                         "fair_share": config == "fair-share",
                         "max_live_children": 1 << 20, "max_descendants": 2 * CHILDREN})
    script = [40]
    for j in range(CHILDREN):
        script += [PROMISE_ID, 41 + j, PROMISE_END_ID]
    script += [SYNC_ID] + [50] * CONTINUATION + [EOS_ID]
    for i in range(2 * slots):
        rid = f"r{i}"
        h.add(rid, [10 + i % 50] * PROMPT, script=script, max_tokens=len(script))
        for j in range(CHILDREN):
            h.scripts[child_id(rid, j)] = [60 + j] * (30 + (i + j) % 20) + [EOS_ID]
    return h


def _timed(obj: Any, name: str, spent: list[float]) -> None:
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
    h = _harness(config, slots)
    sched = h.sched
    fair = [0.0]
    if config == "fair-share":
        _timed(sched.fair_share, "hold_over_share", fair)
        _timed(sched.fair_share, "holds_back", fair)
    gc.collect()
    seconds, steps, scheduled = 0.0, 0, 0
    while sched.requests:
        t0 = time.perf_counter()
        out = sched.schedule()
        t1 = time.perf_counter()
        mro = h.execute(out)
        t2 = time.perf_counter()
        sched.update_from_output(out, mro)
        seconds += (t1 - t0) + (time.perf_counter() - t2)
        steps += 1
        scheduled += len(out.num_scheduled_tokens)
        if steps > 10_000:
            raise RuntimeError(f"{config} at {slots} slots: no end")
    return {"us_per_request_step": 1e6 * seconds / scheduled, "us_per_step": 1e6 * seconds / steps,
            "fair_share_us_per_step": 1e6 * fair[0] / steps, "steps": steps,
            "scheduled_per_step": scheduled / steps,
            "preemptions": sched.hook_stats.get("fair_share_preemptions", 0)}


def run(slot_counts: list[int], repeats: int, log=print) -> dict[str, Any]:
    from benchmarks.common import interleaved

    results: dict[str, Any] = {"slots": slot_counts, "repeats": repeats, "points": {}}
    for slots in slot_counts:
        for config in CONFIGS:  # warm-up, discarded alike
            measure(config, slots)
        runs = interleaved(list(CONFIGS), repeats, lambda c, r: measure(c, slots))
        point = {}
        for config, rs in runs.items():
            point[config] = {key: statistics.median(r[key] for r in rs) for key in rs[0]}
            point[config]["runs_us_per_request_step"] = [r["us_per_request_step"] for r in rs]
        results["points"][str(slots)] = point
        log(f"{slots:4d} slots: " + "  ".join(
            f"{c} {point[c]['us_per_request_step']:.1f}us" for c in CONFIGS))
    return results


def report(results: dict[str, Any], command: str) -> str:
    lines = [
        "# What fair share costs the scheduler per step",
        "",
        f"Command: `{command}` (see `benchmarks/fair_share_step.py` for the workload and "
        "what is timed).",
        f"Median of {results['repeats']} interleaved repeats; a batch of 2 × slots "
        "families given at once; scheduler µs (`schedule()` + `update_from_output()`) "
        "per scheduled request-step over the whole run.",
        "",
        "| slots | fair-share µs | no-fair-share µs | no-fair-share-b µs | "
        "fair-share / no-fair-share | A/A (no-fair-share-b / no-fair-share) | "
        "fair share itself, µs per step | scheduler µs per step (fair-share) | steps | "
        "fair-share preemptions |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for slots, point in results["points"].items():
        on, off, off_b = (point[c] for c in CONFIGS)
        lines.append(
            f"| {slots} | {on['us_per_request_step']:.2f} | {off['us_per_request_step']:.2f} | "
            f"{off_b['us_per_request_step']:.2f} | "
            f"{on['us_per_request_step'] / off['us_per_request_step']:.2f} | "
            f"{off_b['us_per_request_step'] / off['us_per_request_step']:.2f} | "
            f"{on['fair_share_us_per_step']:.0f} | {on['us_per_step']:.0f} | "
            f"{on['steps']:.0f} | {on['preemptions']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from benchmarks.common import publish

    parser = argparse.ArgumentParser(prog="python -m benchmarks.fair_share_step",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slots", type=int, nargs="+", default=[64, 256, 512])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None,
                        help="write fair_share_step.{json,md} there")
    args = parser.parse_args(argv)
    results = run(args.slots, args.repeats)
    command = (f"python -m benchmarks.fair_share_step --slots {' '.join(map(str, args.slots))} "
               f"--repeats {args.repeats}")
    publish(args.out, "fair_share_step", results, report(results, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
