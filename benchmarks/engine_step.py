"""Scheduler and batch-reorder time per step on the real engine.

``python -m benchmarks.engine_step [--families 16 64 128] [--repeats 5]
[--out docs/benchmarks]``

The fork/join workload of ``python -m benchmarks --quick`` (tiny model,
L256 k4 m32: each family's parent writes 4 promises, waits at ``<sync>``,
each child writes 32 tokens) at b families at once, through:

* ``native``: ``vllm_seqhooks.LLM`` with hooks (families grouped in the V1
  model runner's batch by the compiled kernels of ``vllm_seqhooks.native``);
* ``python``: the ``native`` engine with the kernels' Python
  implementations (as without a C compiler, or ``SEQHOOKS_NATIVE=0``);
* ``pairwise``: the ``native`` engine deciding in Python and moving the
  same rows pair by pair with vLLM's ``swap_states`` (today's decision,
  moved as when issue 20 was filed);
* ``filed``: the ``native`` engine grouping as it did when issue 20 was
  filed (``benchmarks/filed_grouping.py``: every step, every id read, the
  families put in the order of their first member, pair by pair with
  ``swap_states``): the baseline of the issue's "≤ 10 % of its cost today";
* ``arrival``: the same with ``batch_order="arrival"`` (vLLM's own batch
  order: the reorder's cost without the family grouping);
* ``loop``: the event-driven client loop over stock ``vllm.LLM``.

Timed on every engine the same way (:class:`benchmarks.common.EngineProbe`):
seconds inside ``schedule()``, ``update_from_output()`` and EngineCore's
building and adding of a client's requests (``preprocess_add_request``: the
``Request`` and its block hashes, which a child gets inside the hook
scheduler's ``update_from_output``; then ``add_request``); the model and the
frontend (tokenizing, output processing) excluded; and seconds in the model
runner's ``_may_reorder_batch``. Reported per engine step and per scheduled
request-step (the requests a step scheduled, spawns and joins included),
median over repeats; configurations interleaved, order rotated, after one
unmeasured warm-up run each. Every run's tokens are checked against the
script.
"""

from __future__ import annotations

import argparse
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.common import Bench, fmt_spread, interleaved, spread

CONFIGS = ("native", "python", "pairwise", "filed", "arrival", "loop")
#: The family groupings compared (their reorder time minus ``arrival``'s).
GROUPINGS = ("native", "python", "pairwise", "filed")
#: The ratios of their µs per step reported (same repeat): to the grouping
#: when issue 20 was filed (its goal: <= 0.10) and to today's decision moved
#: pair by pair.
RATIOS = (("native", "filed"), ("python", "filed"), ("pairwise", "filed"),
          ("native", "pairwise"), ("python", "pairwise"))
SHAPE = dict(context=256, k=4, payload=4, continuation=16, child_tokens=32)


def _per_step(r: dict[str, Any]) -> dict[str, float]:
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


def run(bench: Bench, sizes: list[int], repeats: int) -> dict[str, Any]:
    from benchmarks import forkjoin
    from benchmarks.filed_grouping import grouping_as_filed
    from tests.support.forkjoin import model_runner_of

    forkjoin.engines(bench)
    kv = bench.profile.settings["engines"]["kv_tokens"]
    bench.engine("native_arrival", "hooks-arrival", kv_tokens=kv, scripted=True)
    bench.probe("native_arrival", track_parked=True)
    sep = list(bench.engines["native"].special_kwargs.merge_separator_token_ids or ())
    forkjoin.run_one(bench, "arrival", forkjoin.families(forkjoin.WARM_UP, -1, sep))
    points: dict[int, Any] = {}
    for b in sizes:
        point = {**SHAPE, "batch": b}
        fams_by_repeat: dict[int, Any] = {}

        def one(config: str, r: int) -> dict[str, float]:
            fams = fams_by_repeat.setdefault(r, forkjoin.families(point, r, sep))
            if config == "filed":
                runner = model_runner_of(bench.engines["native"])
                with grouping_as_filed(runner, bench.probes["native"]):
                    return _per_step(forkjoin.run_one(bench, "native", fams))
            if config not in ("python", "pairwise"):
                return _per_step(forkjoin.run_one(bench, config, fams))
            with _in_python(pair_by_pair=config == "pairwise"):
                return _per_step(forkjoin.run_one(bench, "native", fams))

        runs = interleaved(list(CONFIGS), repeats, one)
        out: dict[str, Any] = {}
        for c in CONFIGS:
            out[c] = {k: spread([r[k] for r in runs[c]])
                      for k in ("scheduler_us_per_step", "scheduler_us_per_request_step",
                                "reorder_us_per_step", "requests_per_step", "steps")}
            out[c]["correct"] = all(r["correct"] for r in runs[c])
        out["native/loop per request-step"] = spread([
            a["scheduler_us_per_request_step"] / b_["scheduler_us_per_request_step"]
            for a, b_ in zip(runs["native"], runs["loop"])])
        for c in GROUPINGS:
            out[f"{c} family reorder us per step"] = spread([
                a["reorder_us_per_step"] - b_["reorder_us_per_step"]
                for a, b_ in zip(runs[c], runs["arrival"])])
        for c, base in RATIOS:
            out[f"{c} family reorder / {base}"] = spread([
                (a["reorder_us_per_step"] - z["reorder_us_per_step"])
                / max(1e-9, p["reorder_us_per_step"] - z["reorder_us_per_step"])
                for a, p, z in zip(runs[c], runs[base], runs["arrival"])])
        points[b] = out
        bench.log(f"  b{b}: scheduler us/request-step native "
                  f"{out['native']['scheduler_us_per_request_step']['median']:.1f} loop "
                  f"{out['loop']['scheduler_us_per_request_step']['median']:.1f}; reorder "
                  f"us/step native {out['native']['reorder_us_per_step']['median']:.0f} "
                  f"arrival {out['arrival']['reorder_us_per_step']['median']:.0f}")
    return {"repeats": repeats, "shape": SHAPE, "points": points}


@contextmanager
def _in_python(pair_by_pair: bool):
    """The in-process native engine grouping with the Python implementations
    of the kernels, and (``pair_by_pair``) with swap_states only."""
    from vllm_seqhooks import native
    from vllm_seqhooks.engine.vllm_private import input_batch

    saved = input_batch.ONE_PASS_FROM, native.rows
    native.rows = None
    if pair_by_pair:
        input_batch.ONE_PASS_FROM = 1 << 30
    try:
        yield
    finally:
        input_batch.ONE_PASS_FROM, native.rows = saved


def report(results: dict[str, Any], command: str, env: dict[str, Any]) -> str:
    lines = [
        "# Scheduler and batch-reorder time per step, real engine",
        "",
        f"Command: `{command}` (what is timed: `benchmarks/engine_step.py`). "
        f"Commit {env.get('git_commit', '?')}; {env.get('cpu', '?')}, {env.get('cores', '?')} "
        f"cores. Median [min–max] of {results['repeats']} interleaved repeats.",
        "",
        "| families | configuration | requests per step | scheduler µs / step | "
        "scheduler µs / request-step | reorder µs / step | tokens as scripted |",
        "| ---: | --- | ---: | ---: | ---: | ---: | :---: |",
    ]
    for b, point in results["points"].items():
        for c in CONFIGS:
            p = point[c]
            lines.append(
                f"| {b} | {c} | {p['requests_per_step']['median']:.0f} | "
                f"{fmt_spread(p['scheduler_us_per_step'])} | "
                f"{fmt_spread(p['scheduler_us_per_request_step'], 1)} | "
                f"{fmt_spread(p['reorder_us_per_step'])} | {'yes' if p['correct'] else 'NO'} |")
    lines += ["", "Family grouping, µs per step: each configuration's reorder time minus "
              "`arrival`'s (same repeat).", "",
              "| families | native / loop, scheduler µs per request-step | "
              + " | ".join(GROUPINGS) + " |",
              "| ---: | ---: |" + " ---: |" * len(GROUPINGS)]
    for b, point in results["points"].items():
        lines.append(f"| {b} | {fmt_spread(point['native/loop per request-step'], 2)} | "
                     + " | ".join(fmt_spread(point[f"{c} family reorder us per step"])
                                  for c in GROUPINGS) + " |")
    lines += ["", "Family grouping, ratios of the µs per step above (same repeat): to "
              "`filed` (the grouping when issue 20 was filed: its goal is ≤ 0.10) and to "
              "`pairwise` (today's decision, moved pair by pair).", "",
              "| families | " + " | ".join(f"{c} / {base}" for c, base in RATIOS) + " |",
              "| ---: |" + " ---: |" * len(RATIOS)]
    for b, point in results["points"].items():
        lines.append(f"| {b} | " + " | ".join(
            fmt_spread(point[f"{c} family reorder / {base}"], 3) for c, base in RATIOS) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from benchmarks.__main__ import profiles
    from benchmarks.common import bench_model, environment, publish, setup_env

    parser = argparse.ArgumentParser(prog="python -m benchmarks.engine_step",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", type=int, nargs="+", default=[16, 64, 128])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None,
                        help="write engine_step.{json,md} there")
    parser.add_argument("--profile", default="quick", choices=("quick", "smoke"),
                        help="engine settings and model of `python -m benchmarks --PROFILE`")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="where the benchmark model is built (default: ~/.cache)")
    args = parser.parse_args(argv)
    setup_env(1)
    profile = profiles()[args.profile]
    profile.model = bench_model(profile.size, profile.dtype, args.cache_dir)
    env = environment(argv)
    bench = Bench(profile)
    bench.prime()
    try:
        results = run(bench, args.families, args.repeats)
    finally:
        bench.close_all()
    command = ("python -m benchmarks.engine_step --families "
               + " ".join(map(str, args.families)) + f" --repeats {args.repeats}"
               + ("" if args.profile == "quick" else f" --profile {args.profile}"))
    publish(args.out, "engine_step", {"environment": env, **results},
            report(results, command, env))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
