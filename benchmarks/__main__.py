"""``python -m benchmarks``: sequence hooks against stock vLLM and against a
client-side fork/join loop, side by side in one run.

    python -m benchmarks --quick                 # tiny model, small grid (~2 min)
    python -m benchmarks --full                  # ~100M model, the published grid
    python -m benchmarks --workloads overhead,forkjoin --out /tmp/bench

Workloads (one module each): ``overhead`` (stock vLLM vs vllm_seqhooks.LLM
with hooks off / on but unused), ``forkjoin`` (native hooks vs client loops
over stock vLLM, a grid of context length x promises x batch size),
``parallel`` (forked children vs one sequential request), ``memory`` (KV
blocks, and a KV cache too small for every family). Every engine is created
once and reused; the configurations compared run interleaved, repeated,
order rotated. Results: ``results-<profile>.json``, ``results-<profile>.md``
and ``forkjoin-<profile>.png`` under ``--out`` (default: a user cache,
``${XDG_CACHE_HOME:-~/.cache}/vllm-seqhooks/benchmarks``). The published pages
in docs/benchmarks change only when ``--out docs/benchmarks`` names them:

    python -m benchmarks --full --out docs/benchmarks   # regenerate results-full.*
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (Bench, Profile, bench_model, default_out_dir, environment,
                               exit_leaving_engines, leave_engines_to_exit, model_params,
                               setup_env)

WORKLOADS = ("overhead", "forkjoin", "parallel", "memory")

ALL_LOOPS = ["native", "loop", "eager", "lockstep"]


def profiles() -> dict[str, Profile]:
    """The run sizes. ``--full`` is what docs/benchmarks/README.md reports."""
    quick_shape = dict(payload=4, continuation=16, child_tokens=32)
    full_shape = dict(payload=4, continuation=16, child_tokens=64)
    return {
        "smoke": Profile(
            name="smoke", size="tiny", dtype="float32", repeats=1, max_model_len=2048,
            smoke=True,
            settings={
                "engines": {"kv_tokens": 16384},
                "overhead": {"batch": 2, "prompt_tokens": 16, "max_tokens": 8},
                "forkjoin": {"shape": dict(payload=2, continuation=4, child_tokens=6),
                             "configs": [*ALL_LOOPS, "arrival"],
                             "points": [{"context": 64, "k": 2, "batch": 2}]},
                "parallel": {"shape": dict(payload=2, continuation=4, child_tokens=6),
                             "points": [{"context": 64, "k": 2, "batch": 1}]},
                "memory": {"point": dict(context=64, k=2, batch=4, payload=2,
                                         continuation=4, child_tokens=40),
                           "tight_fraction": 0.5, "configs": ["native", "loop"]},
            }),
        "quick": Profile(
            name="quick", size="tiny", dtype="float32", repeats=3,
            settings={
                "engines": {"kv_tokens": 65536},
                "overhead": {"batch": 16, "prompt_tokens": 64, "max_tokens": 64,
                             "repeats": 5, "kv_tokens": 8192},
                "forkjoin": {"shape": quick_shape, "configs": ["native", "loop"],
                             "points": [
                                 {"context": 256, "k": 2, "batch": 1},
                                 {"context": 256, "k": 4, "batch": 1, "configs": ALL_LOOPS},
                                 {"context": 256, "k": 8, "batch": 1},
                                 {"context": 1024, "k": 4, "batch": 1},
                                 {"context": 4096, "k": 4, "batch": 1},
                                 {"context": 256, "k": 4, "batch": 1, "think": 32,
                                  "configs": ALL_LOOPS},
                                 {"context": 256, "k": 4, "batch": 16,
                                  "configs": [*ALL_LOOPS, "arrival"]},
                                 {"context": 256, "k": 4, "batch": 64},
                             ]},
                "parallel": {"shape": quick_shape,
                             "points": [{"context": 256, "k": k, "batch": 1}
                                        for k in (2, 4, 8)]},
                "memory": {"point": dict(context=256, k=4, batch=16, **quick_shape),
                           "tight_fraction": 0.3, "configs": ["native", "loop"]},
            }),
        "full": Profile(
            name="full", size="base", dtype="bfloat16", repeats=3,
            settings={
                "engines": {"kv_tokens": 65536},
                "overhead": {"batch": 16, "prompt_tokens": 128, "max_tokens": 64,
                             "repeats": 8, "kv_tokens": 8192},
                "forkjoin": {"shape": full_shape, "configs": ["native", "loop"],
                             "points": [
                                 *({"context": c, "k": k, "batch": 1}
                                   for c in (256, 1024, 4096) for k in (2, 4, 8)
                                   if not (c == 1024 and k == 4)),
                                 {"context": 1024, "k": 4, "batch": 1, "configs": ALL_LOOPS},
                                 {"context": 1024, "k": 4, "batch": 1, "think": 64,
                                  "configs": ALL_LOOPS},
                                 {"context": 256, "k": 4, "batch": 16, "configs": ALL_LOOPS},
                                 {"context": 1024, "k": 4, "batch": 16,
                                  "configs": ["native", "loop", "arrival"]},
                                 {"context": 256, "k": 4, "batch": 64,
                                  "configs": ["native", "loop", "arrival"]},
                             ]},
                "parallel": {"shape": full_shape,
                             "points": [*({"context": 256, "k": k, "batch": 1}
                                          for k in (2, 4, 8)),
                                        {"context": 256, "k": 4, "batch": 16, "repeats": 2}]},
                "memory": {"point": dict(context=1024, k=4, batch=16, **full_shape),
                           "tight_fraction": 0.3, "configs": ["native", "loop"],
                           "repeats": 2},
            }),
        "extra": Profile(
            name="extra", size="base", dtype="bfloat16", repeats=2,
            settings={
                "engines": {"kv_tokens": 131072},
                "forkjoin": {"shape": full_shape, "configs": ["native", "loop"],
                             "points": [
                                 {"context": 1024, "k": 4, "batch": 16, "think": 64,
                                  "configs": ["native", "loop", "eager"]},
                                 {"context": 4096, "k": 4, "batch": 16},
                                 {"context": 1024, "k": 4, "batch": 64},
                             ]},
            }),
    }


def run(profile: Profile, workloads: list[str], out_dir: Path | None, argv: list[str],
        log=print, threads: int | None = 1, cache_dir: Path | None = None,
        update: bool = False, timeout_s: float = 900.0) -> dict[str, Any]:
    setup_env(threads)
    t_start = time.perf_counter()
    profile.model = bench_model(profile.size, profile.dtype, cache_dir)
    env = environment(argv)
    env.update(profile=profile.name, model=f"random-weight Llama '{profile.size}' "
               f"({model_params(profile.model) / 1e6:.1f}M parameters, {profile.dtype})",
               block_size=profile.block_size, max_num_seqs=profile.max_num_seqs,
               max_num_batched_tokens=profile.max_num_batched_tokens,
               repeats=profile.repeats)
    log(f"benchmarks ({profile.name}): {env['model']}; {env['cpu']}, {env['cores']} cores")
    bench = Bench(profile, log, timeout_s)
    bench.prime()
    results: dict[str, Any] = {"environment": env, "workloads": {}}
    from benchmarks import forkjoin, memory, overhead, parallel

    modules = {"overhead": overhead, "forkjoin": forkjoin, "parallel": parallel,
               "memory": memory}
    try:
        for name in workloads:
            t0 = time.perf_counter()
            log(f"[{name}]")
            start = environment(argv)
            results["workloads"][name] = modules[name].run(bench)
            results["workloads"][name]["seconds"] = round(time.perf_counter() - t0, 1)
            results["workloads"][name]["run"] = {
                "date": start["date"], "command": env["command"],
                "load_average_at_start": start["load_average_at_start"],
                "seconds": round(time.perf_counter() - t0, 1)}
            log(f"  ({time.perf_counter() - t0:.0f} s)")
            if name == "overhead":
                for cfg in overhead.CONFIGS:
                    bench.close(f"overhead_{cfg}")
    finally:
        results["engines"] = bench.engine_info
        bench.close_all()
    env["total_seconds"] = round(time.perf_counter() - t_start, 1)
    if out_dir is not None:
        from benchmarks import report

        old = Path(out_dir) / f"results-{profile.name}.json"
        if update and old.exists():
            # Keep the other workloads of an earlier run (each carries its own
            # date and command).
            previous = json.loads(old.read_text())
            merged = dict(previous.get("workloads", {}))
            merged.update(results["workloads"])
            results["workloads"] = {k: merged[k] for k in WORKLOADS if k in merged}
            engines = dict(previous.get("engines", {}))
            engines.update(results["engines"])
            results["engines"] = engines
            # The header stays the earlier run's; re-run sections name their
            # own command and date (report._measured).
            env_prev = dict(previous.get("environment", {}))
            new_env = dict(results["environment"], workloads=list(workloads))
            kept = [u for u in env_prev.get("updates", [])
                    if not set(u.get("workloads", ())) <= set(workloads)]
            env_prev["updates"] = [*kept, new_env]
            results["environment"] = env_prev

        paths = report.write(results, out_dir)
        for p in paths:
            log(f"wrote {p}")
    return results


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="tiny model, small grid (default)")
    size.add_argument("--full", action="store_true", help="~100M model, the published grid")
    size.add_argument("--extra", action="store_true",
                      help="the grid points --full leaves out for time (batch 16 at 4,096 "
                           "tokens, batch 64 at 1,024, batch 16 with t=64): ~20 min more")
    size.add_argument("--smoke", action="store_true", help="smallest sizes (CI)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help=f"comma-separated subset of {','.join(WORKLOADS)}")
    parser.add_argument("--out", type=Path, default=None,
                        help="where to write results-<profile>.{json,md} and the chart "
                             f"(default: {default_out_dir()}; the published pages change "
                             "only with --out docs/benchmarks)")
    parser.add_argument("--repeats", type=int, help="override the profile's repeats")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch/OpenMP threads (OMP_NUM_THREADS, unless set; default 1: "
                             "see benchmarks.common.setup_env)")
    parser.add_argument("--update", action="store_true",
                        help="merge into an existing results-<profile>.json in --out "
                             "(re-run some workloads, keep the others)")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="where the random-weight models are built once "
                             "(default ~/.cache/vllm-seqhooks/bench)")
    parser.add_argument("--async-scheduling", action="store_true",
                        help="run every engine with vLLM's async scheduling (the GPU "
                             "default; the CPU platform turns it off): results go to "
                             "results-<profile>-async.*")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds one run may take before it is aborted")
    return parser


def output_dir(args: argparse.Namespace) -> Path:
    """Where the run writes: ``--out``, else the user cache (never docs/)."""
    return args.out if args.out is not None else default_out_dir()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    name = ("full" if args.full else "extra" if args.extra else "smoke" if args.smoke
            else "quick")
    profile = profiles()[name]
    if args.async_scheduling:
        from tests.support.async_scheduling import force_async_scheduling

        force_async_scheduling()
        profile.name += "-async"
    if args.repeats:
        profile.repeats = args.repeats
        for st in profile.settings.values():
            if isinstance(st, dict):
                st.pop("repeats", None)
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    workloads = [w for w in workloads if w in profile.settings or w not in WORKLOADS]
    bad = [w for w in workloads if w not in WORKLOADS]
    if bad:
        parser.error(f"unknown workload(s) {bad}; choose from {WORKLOADS}")
    if profile.smoke:
        leave_engines_to_exit()
    results = run(profile, workloads, output_dir(args), argv, threads=args.threads,
                  cache_dir=args.cache_dir, update=args.update, timeout_s=args.timeout)
    ok = all_correct(results)
    if not ok:
        print("ERROR: some configuration produced unexpected tokens", file=sys.stderr)
    if profile.smoke:
        exit_leaving_engines(0 if ok else 1)
    return 0 if ok else 1


def all_correct(results: dict[str, Any]) -> bool:
    ok = True
    w = results["workloads"]
    for p in w.get("forkjoin", {}).get("points", []):
        ok &= all(c["correct"] for c in p["configs"].values())
    for p in w.get("parallel", {}).get("points", []):
        ok &= p["correct"]
    for part in ("ample", "tight"):
        for name, c in w.get("memory", {}).get(part, {}).items():
            if isinstance(c, dict) and "correct" in c:
                ok &= c["correct"]
    for c in w.get("overhead", {}).get("configs", {}).values():
        ok &= c["same_tokens"]
    return bool(ok)


if __name__ == "__main__":
    raise SystemExit(main())
