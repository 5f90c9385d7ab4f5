"""Workload ``engine``: scheduler and batch-reorder time per step on the real
engine.

``python -m benchmarks.step --workload engine [--sizes 16 64 128]
[--repeats 5] [--profile quick]``

The fork/join workload of ``python -m benchmarks --quick`` (tiny model,
L256 k4 m32: each family's parent writes 4 promises, waits at ``<sync>``,
each child writes 32 tokens) with ``--sizes`` families at once, through:

* ``native``: ``vllm_seqhooks.LLM`` with hooks (families grouped in the V1
  model runner's batch, ``batch_order="family"``);
* ``arrival``: the same with ``batch_order="arrival"`` (vLLM's own batch
  order: the reorder's cost without the family grouping);
* ``loop``: the client loop over stock ``vllm.LLM``
  (:class:`vllm_seqhooks.loops.promise_loop.ClientLoop`, ``mode="events"``).

Timed on every engine the same way (:class:`benchmarks.common.EngineProbe`):
seconds inside ``schedule()``, ``update_from_output()`` and EngineCore's
building and adding of a client's requests (``preprocess_add_request``: the
``Request`` and its block hashes, which a child gets inside the hook
scheduler's ``update_from_output``; then ``add_request``); the model and the
frontend (tokenizing, output processing) excluded; and seconds in the model
runner's ``_may_reorder_batch``. Reported per engine step and per scheduled
request-step (the requests a step scheduled, spawns and joins included),
median over repeats; the family grouping's own cost is ``native``'s reorder
time minus ``arrival``'s in the same repeat. One unmeasured warm-up run per
engine; every run's tokens are checked against the script.
"""

from __future__ import annotations

from typing import Any

from benchmarks.common import Bench, fmt_spread, spread
from benchmarks.step.harness import Options, header, ratio, repeat_sizes, spreads, table

TITLE = "Scheduler and batch-reorder time per step, real engine"
SIZES = "families"
DEFAULT_SIZES = [16, 64, 128]
CONFIGS = ("native", "arrival", "loop")
KEYS = ("scheduler_us_per_step", "scheduler_us_per_request_step", "reorder_us_per_step",
        "requests_per_step", "steps")
SHAPE = dict(context=256, k=4, payload=4, continuation=16, child_tokens=32)


def per_step(r: dict[str, Any]) -> dict[str, Any]:
    """A fork/join run's counters (:func:`benchmarks.forkjoin.run_one`) per
    engine step and per scheduled request-step."""
    steps = max(1, r["steps"])
    return {
        "scheduler_us_per_step": 1e6 * r["scheduler_s"] / steps,
        "scheduler_us_per_request_step": 1e6 * r["scheduler_s"]
        / max(1, r["scheduled_request_steps"]),
        "reorder_us_per_step": 1e6 * r["reorder_s"] / steps,
        "requests_per_step": r["scheduled_request_steps"] / steps,
        "steps": r["steps"],
        "correct": r["correct"],
    }


def measure_all(bench: Bench, opts: Options, log=print) -> dict[str, Any]:
    from benchmarks import forkjoin

    forkjoin.engines(bench)
    forkjoin.arrival_engine(bench)
    sep = list(bench.engines["native"].special_kwargs.merge_separator_token_ids or ())
    fams: dict[tuple[int, int], Any] = {}

    def one(config: str, b: int, r: int) -> dict[str, Any]:
        point = {**SHAPE, "batch": b}
        return per_step(forkjoin.run_one(
            bench, config, fams.setdefault((b, r), forkjoin.families(point, r, sep))))

    runs = repeat_sizes(opts.sizes, CONFIGS, opts.repeats, one, log=log)
    points: dict[str, Any] = {}
    for b, by_config in runs.items():
        out: dict[str, Any] = {c: {**spreads(rs, KEYS), "correct": all(r["correct"] for r in rs)}
                               for c, rs in by_config.items()}
        out["native/loop per request-step"] = ratio(
            by_config["native"], by_config["loop"], "scheduler_us_per_request_step")
        out["family grouping us per step"] = spread([
            a["reorder_us_per_step"] - z["reorder_us_per_step"]
            for a, z in zip(by_config["native"], by_config["arrival"])])
        points[str(b)] = out
        log(f"  b{b}: scheduler us/request-step native "
            f"{out['native']['scheduler_us_per_request_step']['median']:.1f} loop "
            f"{out['loop']['scheduler_us_per_request_step']['median']:.1f}; family grouping "
            f"{out['family grouping us per step']['median']:.0f} us/step")
    return points


def run(opts: Options, log=print) -> dict[str, Any]:
    from benchmarks.__main__ import profiles
    from benchmarks.common import bench_model

    profile = profiles()[opts.profile]
    profile.model = bench_model(profile.size, profile.dtype, opts.cache_dir)
    bench = Bench(profile, log)
    bench.prime()
    try:
        points = measure_all(bench, opts, log)
    finally:
        bench.close_all()
    return {"sizes": opts.sizes, "repeats": opts.repeats, "profile": opts.profile,
            "shape": SHAPE, "points": points}


def report(results: dict[str, Any], command: str, env: dict[str, Any]) -> str:
    lines = header(TITLE, "engine", command, env, (
        f"Median [min–max] of {results['repeats']} interleaved repeats."))
    rows = []
    for b, point in results["points"].items():
        for c in CONFIGS:
            p = point[c]
            rows.append([b, c, f"{p['requests_per_step']['median']:.0f}",
                         fmt_spread(p["scheduler_us_per_step"]),
                         fmt_spread(p["scheduler_us_per_request_step"], 1),
                         fmt_spread(p["reorder_us_per_step"]),
                         "yes" if p["correct"] else "NO"])
    lines += table(["families", "configuration", "requests per step", "scheduler µs / step",
                    "scheduler µs / request-step", "reorder µs / step", "tokens as scripted"],
                   rows, "rlrrrrc")
    lines += ["", "Native against the client loop, and the family grouping's own cost "
              "(`native`'s reorder time minus `arrival`'s, same repeat):", ""]
    lines += table(["families", "native / loop, scheduler µs per request-step",
                    "family grouping µs per step"],
                   [[b, fmt_spread(p["native/loop per request-step"], 2),
                     fmt_spread(p["family grouping us per step"])]
                    for b, p in results["points"].items()])
    return "\n".join(lines) + "\n"
