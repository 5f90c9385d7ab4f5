"""Scheduler time per step against live requests, without a model.

``python -m benchmarks.scheduler_step [--sizes 64 256 1024 4096] [--repeats 5]
[--steps 40] [--out docs/benchmarks]``

Drives vLLM's scheduler and the hook scheduler directly, with synthetic
model-runner outputs (the surgical harness of ``vllm_seqhooks.testing``:
every scheduled request samples one token a step, as vLLM's own scheduler
tests build them), so that only ``schedule()`` and ``update_from_output()``
are timed: the "model" (the harness building the output) is outside the
timed span for every configuration alike. For each number of live requests N:

* ``stock``: vLLM's own ``Scheduler``, N plain requests;
* ``stock-b``: the same again (the A/A control: its ratio to ``stock`` is
  the noise of the measurement);
* ``hooks-unused``: the hook scheduler, N plain requests (hooks on, no hook
  token sampled);
* ``hooks-off``: the hook scheduler, N requests that turn hooks off
  (``seqhooks_enabled=false``);
* ``families``: the hook scheduler, N/5 requests that each spawn 4 children
  and park at ``<sync>``: N live requests, of which the 4N/5 children run.

Each configuration is built, brought to steady decode (every request past
its prefill and, for families, every child spawned and every parent
parked), then ``--steps`` steps are timed; a configuration's first build
and run per size (warm-up) are discarded for all alike, and configurations
run interleaved (``benchmarks.common.interleaved``). Reported: µs per step
(median over repeats) and per running request, and the slope per live
request of a least-squares fit over the sizes. Sync scheduling; one token per
request per step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

CONFIGS = ("stock", "stock-b", "hooks-unused", "hooks-off", "families")
CHILDREN = 4
PROMPT = 16
#: Enough tokens that nothing finishes while it is timed.
MAX_TOKENS = 400


def _harness(config: str, live: int):
    from vllm_seqhooks.testing.sched_harness import SchedHarness

    blocks_per_request = -(-(PROMPT + MAX_TOKENS + 8) // 32) + 1
    kwargs: dict[str, Any] = dict(
        num_blocks=live * blocks_per_request + 64, block_size=32, max_num_seqs=live,
        max_model_len=PROMPT + MAX_TOKENS + 64,
        max_num_batched_tokens=max(2048, live * 2), check=False,
    )
    if config.startswith("stock"):
        kwargs["stock"] = True
    else:
        # Every family's children live at once (past 1,024 a fork's children
        # would wait for the engine's live-children limit).
        kwargs["hooks"] = {"max_children_per_request": CHILDREN, "fair_share": True,
                           "max_live_children": 1 << 20}
    return SchedHarness(False, **kwargs)


def _populate(h, config: str, live: int) -> int:
    """Add the configuration's requests; the number it will keep running."""
    from vllm_seqhooks.testing.sched_harness import EOS_ID, PROMISE_END_ID, PROMISE_ID, SYNC_ID

    if config == "families":
        roots = max(1, live // (CHILDREN + 1))
        script = [40]
        for j in range(CHILDREN):
            script += [PROMISE_ID, 41 + j, PROMISE_END_ID]
        script += [SYNC_ID, 50] + [51] * MAX_TOKENS + [EOS_ID]
        for i in range(roots):
            h.add(f"f{i}", [10 + i % 50] * PROMPT, script=script, max_tokens=MAX_TOKENS)
        return roots * CHILDREN
    extra = {"seqhooks_enabled": False} if config == "hooks-off" else None
    for i in range(live):
        h.add(f"r{i}", [10 + i % 50] * PROMPT, max_tokens=MAX_TOKENS, extra_args=extra)
    return live


def _one_step(h) -> tuple[float, int]:
    """One sync engine step; the seconds spent in the scheduler and the
    requests it scheduled."""
    sched = h.sched
    t0 = time.perf_counter()
    out = sched.schedule()
    t1 = time.perf_counter()
    mro = h.execute(out)
    t2 = time.perf_counter()
    sched.update_from_output(out, mro)
    t3 = time.perf_counter()
    return (t1 - t0) + (t3 - t2), len(out.num_scheduled_tokens)


def measure(config: str, live: int, steps: int) -> dict[str, float]:
    h = _harness(config, live)
    running = _populate(h, config, live)
    for _ in range(200):  # to steady decode: prefills done, children spawned
        _, scheduled = _one_step(h)
        if scheduled >= running and all(
                r.num_computed_tokens >= r.num_prompt_tokens for r in h.sched.running):
            break
    else:
        raise RuntimeError(f"{config} at {live}: no steady state")
    for _ in range(3):
        _one_step(h)
    seconds, scheduled = 0.0, 0
    for _ in range(steps):
        s, n = _one_step(h)
        seconds += s
        scheduled += n
    return {"us_per_step": 1e6 * seconds / steps, "scheduled_per_step": scheduled / steps,
            "live": len(h.sched.requests)}


def _slope(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares ``y = a + b x``: (a, b)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else float("nan")
    return my - b * mx, b


def run(sizes: list[int], repeats: int, steps: int, log=print) -> dict[str, Any]:
    from benchmarks.common import interleaved

    results: dict[str, Any] = {"sizes": sizes, "repeats": repeats, "steps": steps, "points": {}}
    for live in sizes:
        for config in CONFIGS:  # warm-up, discarded alike
            measure(config, live, max(5, steps // 4))
        runs = interleaved(list(CONFIGS), repeats, lambda c, r: measure(c, live, steps))
        point = {}
        for config, rs in runs.items():
            us = statistics.median(r["us_per_step"] for r in rs)
            point[config] = {"us_per_step": us, "runs_us": [r["us_per_step"] for r in rs],
                             "scheduled_per_step": rs[0]["scheduled_per_step"],
                             "live": rs[0]["live"]}
        results["points"][str(live)] = point
        log(f"{live:5d} live: " + "  ".join(
            f"{c} {point[c]['us_per_step']:.0f}us" for c in CONFIGS))
    results["fits"] = {
        c: dict(zip(("fixed_us", "us_per_live_request"), _slope(
            [(results["points"][str(n)][c]["live"], results["points"][str(n)][c]["us_per_step"])
             for n in sizes])))
        for c in CONFIGS
    }
    return results


def report(results: dict[str, Any], command: str) -> str:
    lines = [
        "# Scheduler time per step, without a model",
        "",
        f"Command: `{command}` (see `benchmarks/scheduler_step.py` for what is timed).",
        f"Median of {results['repeats']} interleaved repeats of {results['steps']} steps; "
        "µs spent in `schedule()` + `update_from_output()` per step. Read every ratio "
        "against the A/A column (`stock-b / stock`): a difference within its spread is noise.",
        "",
        "| live requests | " + " | ".join(CONFIGS) + " | stock-b / stock (A/A) | "
        "hooks-unused / stock | hooks-off / stock | families / stock |",
        "| ---: | " + " | ".join("---:" for _ in CONFIGS) + " | ---: | ---: | ---: | ---: |",
    ]
    for live, point in results["points"].items():
        base = point["stock"]["us_per_step"]
        cells = [f"{point[c]['us_per_step']:.0f}" for c in CONFIGS]
        ratios = [f"{point[c]['us_per_step'] / base:.2f}"
                  for c in ("stock-b", "hooks-unused", "hooks-off", "families")]
        lines.append(f"| {live} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    lines += ["", "Least-squares fit over the sizes, µs per step = fixed + slope × live "
              "requests (for `families`, live = parents parked + children running):", "",
              "| configuration | fixed µs | µs per live request | slope / stock's |",
              "| --- | ---: | ---: | ---: |"]
    stock_slope = results["fits"]["stock"]["us_per_live_request"]
    for c in CONFIGS:
        fit = results["fits"][c]
        lines.append(f"| {c} | {fit['fixed_us']:.0f} | {fit['us_per_live_request']:.2f} | "
                     f"{fit['us_per_live_request'] / stock_slope:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scheduler_step",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024, 4096])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out", type=Path, default=None,
                        help="write scheduler_step.{json,md} there")
    args = parser.parse_args(argv)
    results = run(args.sizes, args.repeats, args.steps)
    command = "python -m benchmarks.scheduler_step " + " ".join(
        [f"--sizes {' '.join(map(str, args.sizes))}", f"--repeats {args.repeats}",
         f"--steps {args.steps}"])
    text = report(results, command)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "scheduler_step.json").write_text(json.dumps(results, indent=1))
        (args.out / "scheduler_step.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
