"""``vllm serve`` on a GPU-timed engine:

    python -m benchmarks.gpu_timed.serve MODEL --profile h100-sxm/qwen3-8b \\
        [--stats-path FILE] [--filler-token ID] [any vllm serve flag ...]

vLLM's own CLI (``vllm serve``, the OpenAI server, the engine core, a worker
process) with async scheduling kept on (the CPU platform turns it off) and
the worker of :mod:`.worker`: each step waits as long as the profile's GPU
would take. The hook flags (``--seqhooks``, ``--sync-token-id``, ...) work
as with ``vllm serve``.
"""

from __future__ import annotations

import argparse
import json
import sys

from benchmarks.gpu_timed.engine_args import gpu_timed_engine_args


def serve_argv(model: str, profile: str, *, filler_token: int, stats_path: str | None,
               rest: list[str]) -> list[str]:
    """The ``vllm serve`` command line of a GPU-timed server."""
    kw = gpu_timed_engine_args(profile, filler_token=filler_token, stats_path=stats_path)
    return ["vllm", "serve", model, "--worker-cls", kw["worker_cls"],
            "--additional-config", json.dumps(kw["additional_config"]), *rest]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--profile", required=True, help="<gpu>/<model>, e.g. h100-sxm/qwen3-8b")
    parser.add_argument("--filler-token", type=int, required=True,
                        help="the token an unscripted request samples")
    parser.add_argument("--stats-path", help="where the worker writes its counters (JSON)")
    args, rest = parser.parse_known_args(argv)
    from tests.support.async_scheduling import force_async_scheduling

    force_async_scheduling()
    sys.argv = serve_argv(args.model, args.profile, filler_token=args.filler_token,
                          stats_path=args.stats_path, rest=rest)
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


if __name__ == "__main__":
    main()
