"""``python -m benchmarks.step --workload NAME``: see :mod:`benchmarks.step`."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from benchmarks.step import WORKLOADS
from benchmarks.step.harness import Options


def workload(name: str):
    return importlib.import_module(f"benchmarks.step.{name}")


def parser() -> argparse.ArgumentParser:
    import benchmarks.step as package

    sizes = "; ".join(f"{name}: {workload(name).SIZES} (default "
                      f"{' '.join(map(str, workload(name).DEFAULT_SIZES))})"
                      for name in WORKLOADS)
    p = argparse.ArgumentParser(prog="python -m benchmarks.step", description=package.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", required=True, choices=WORKLOADS)
    p.add_argument("--sizes", type=int, nargs="+", help=f"the workload's sizes: {sizes}")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=None,
                   help="scheduler: timed steps per run (default 40)")
    p.add_argument("--profile", default=None, choices=("quick", "smoke"),
                   help="engine: the engines and model of `python -m benchmarks --PROFILE` "
                        "(default quick)")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="engine: where the benchmark model is built (default: ~/.cache)")
    p.add_argument("--out", type=Path, default=None,
                   help="directory for step_<workload>.{json,md} (default: print only; "
                        "the published page changes only with --out docs/benchmarks)")
    return p


#: Options that only some workloads read.
ONLY_FOR = {"steps": "scheduler", "profile": "engine", "cache_dir": "engine"}


def options(argv: list[str]) -> argparse.Namespace:
    """The parsed options, defaults filled in; an option the workload does
    not read is an error."""
    p = parser()
    args = p.parse_args(argv)
    for name, only in ONLY_FOR.items():
        if getattr(args, name) is not None and args.workload != only:
            p.error(f"--{name.replace('_', '-')} is for --workload {only}")
    args.sizes = args.sizes or list(workload(args.workload).DEFAULT_SIZES)
    args.steps = 40 if args.steps is None else args.steps
    args.profile = args.profile or "quick"
    return args


def command(args: argparse.Namespace) -> str:
    """The page's command: what regenerates it (``--out`` and ``--cache-dir``
    left out)."""
    parts = ["python -m benchmarks.step", f"--workload {args.workload}",
             "--sizes " + " ".join(map(str, args.sizes)), f"--repeats {args.repeats}"]
    if args.workload == "scheduler":
        parts.append(f"--steps {args.steps}")
    if args.workload == "engine" and args.profile != "quick":
        parts.append(f"--profile {args.profile}")
    return " ".join(parts)


def main(argv: list[str] | None = None) -> int:
    from benchmarks.common import environment, publish, setup_env

    argv = list(sys.argv[1:] if argv is None else argv)
    args = options(argv)
    module = workload(args.workload)
    setup_env(1)
    env = environment(argv)
    env["command"] = command(args)
    opts = Options(sizes=args.sizes, repeats=args.repeats, steps=args.steps,
                   profile=args.profile, cache_dir=args.cache_dir)
    results = module.run(opts)
    publish(args.out, f"step_{args.workload}",
            {"workload": args.workload, "environment": env, **results},
            module.report(results, env["command"], env))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
