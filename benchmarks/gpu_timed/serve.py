"""``vllm serve`` on a GPU-timed engine:

    python -m benchmarks.gpu_timed.serve MODEL --profile h100-sxm/qwen3-8b \\
        --filler-token ID [--stats-path FILE] [--scheduler-stats-path FILE] \\
        [--trace-mode native|sequential --trace-scale S --trace-prompt-tokens N] \\
        [any vllm serve flag ...]

vLLM's own CLI (``vllm serve``, the OpenAI server, the engine core, a worker
process) with async scheduling kept on (the CPU platform turns it off) and
the worker of :mod:`.worker`: each step waits as long as the profile's GPU
would take. The hook flags (``--seqhooks``, ``--sync-token-id``, ...) work
as with ``vllm serve``. ``--scheduler-stats-path``: the scheduler's thread
CPU per call (:mod:`.timed_scheduler`); ``--trace-*``: requests without a
script sample the ThreadWeaver-format family their prompt picks
(:mod:`.trace_book`), so ``vllm bench serve``'s plain prompts drive families.
"""

from __future__ import annotations

import argparse
import json
import sys

from benchmarks.gpu_timed.engine_args import gpu_timed_engine_args
from benchmarks.gpu_timed.trace_book import MODES

HOOK_FLAGS = ("--seqhooks", "--sync-token-id", "--promise-token-id")


def has_hooks(argv: list[str]) -> bool:
    return any(a == f or a.startswith(f + "=") for a in argv for f in HOOK_FLAGS)


def serve_argv(model: str, profile: str, *, filler_token: int, stats_path: str | None,
               rest: list[str], scheduler_stats_path: str | None = None,
               traces: dict | None = None) -> list[str]:
    """The ``vllm serve`` command line of a GPU-timed server."""
    kw = gpu_timed_engine_args(profile, filler_token=filler_token, stats_path=stats_path,
                               scheduler_stats_path=scheduler_stats_path,
                               hooks=has_hooks(rest), traces=traces)
    argv = ["vllm", "serve", model, "--worker-cls", kw["worker_cls"],
            "--additional-config", json.dumps(kw["additional_config"])]
    if "scheduler_cls" in kw:
        argv += ["--scheduler-cls", kw["scheduler_cls"]]
    return argv + rest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--profile", required=True, help="<gpu>/<model>, e.g. h100-sxm/qwen3-8b")
    parser.add_argument("--filler-token", type=int, required=True,
                        help="the token an unscripted request samples")
    parser.add_argument("--stats-path", help="where the worker writes its counters (JSON)")
    parser.add_argument("--scheduler-stats-path",
                        help="where the scheduler's thread-CPU counters go (JSON)")
    parser.add_argument("--trace-mode", choices=MODES)
    parser.add_argument("--trace-scale", type=float, default=0.125)
    parser.add_argument("--trace-prompt-tokens", type=int, default=64)
    args, rest = parser.parse_known_args(argv)
    from tests.support.async_scheduling import force_async_scheduling

    force_async_scheduling()
    traces = None if args.trace_mode is None else {
        "mode": args.trace_mode, "scale": args.trace_scale,
        "prompt_tokens": args.trace_prompt_tokens}
    if args.scheduler_stats_path and has_hooks(rest):
        from benchmarks.gpu_timed.timed_scheduler import time_the_hook_scheduler

        time_the_hook_scheduler()
    sys.argv = serve_argv(args.model, args.profile, filler_token=args.filler_token,
                          stats_path=args.stats_path, rest=rest,
                          scheduler_stats_path=args.scheduler_stats_path, traces=traces)
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


if __name__ == "__main__":
    main()
