"""ThreadWeaver-format families on one GPU-timed engine, in-process (the
first piece of the GPU-timed grid, issue 52; not the grid):

    python -m benchmarks.gpu_timed.families CONFIG PROFILE SIZES [--scale S]

``CONFIG``: ``native`` (``vllm_seqhooks.LLM`` with ThreadWeaver's format:
one request per family), ``sequential`` (stock ``vllm.LLM``, one request per
family writing every thread in turn: the anchors' baseline) or
``loop-in-process`` (ThreadWeaver's loop as
:class:`vllm_seqhooks.loops.format_loop.FormatLoop` over a stock ``vllm.LLM``
in lockstep rounds: families wait for each other's rounds, unlike the HTTP
loop of the grid). ``PROFILE``: ``h100-sxm/qwen3-8b`` and the others of
:mod:`.profiles`. ``SIZES``: families at once, e.g. ``1,16``.

Each family follows a trace drawn from ThreadWeaver's published lengths
(:mod:`.traces`) times ``--scale`` (0.125 by default). One JSON row per size:
wall seconds, modelled GPU seconds (wall close to it: the host kept up),
engine steps and request-steps, and the scheduler's thread-CPU time per
step and per request-step (:mod:`.timed_scheduler`). No A/A control and one
run per size: a check of the engine, not a figure to publish. Writes only
into a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path

from benchmarks.gpu_timed.grid import counters

CONFIGS = ("native", "sequential", "loop-in-process")
FORMAT = {"format": "threadweaver", "max_child_depth": 1, "fork_min_tokens": 1}
PROMPT_TOKENS = 128


def _engine(config: str, profile: str, model: str, stats: Path):
    from vllm_seqhooks.scripted.tiny_model import TINY_ENGINE_KWARGS

    from benchmarks.gpu_timed.engine_args import ENGINE_SIZE, gpu_timed_engine_args

    kw = {**TINY_ENGINE_KWARGS, **ENGINE_SIZE,
          **gpu_timed_engine_args(profile, filler_token=40, stats_path=str(stats),
                                  scheduler_stats_path=f"{stats}.sched",
                                  hooks=config == "native")}
    if config == "native":
        from benchmarks.gpu_timed.timed_scheduler import time_the_hook_scheduler
        from vllm_seqhooks.llm import LLM

        time_the_hook_scheduler()
        return LLM(model, special_kwargs=FORMAT, **kw)
    from vllm import LLM

    return LLM(model, **kw)


def run(config: str, profile: str, sizes: list[int], scale: float) -> list[dict]:
    from tests.support.async_scheduling import force_async_scheduling
    from vllm_seqhooks.scripted.llm import Scripts
    from vllm_seqhooks.scripted.tiny_model import build_tiny_model

    from benchmarks.common import default_cache_dir
    from benchmarks.gpu_timed.traces import draw_trace, trace_text

    force_async_scheduling()
    model = str(build_tiny_model(default_cache_dir() / "tiny-model"))
    stats = Path(tempfile.mkdtemp(prefix="seqhooks-gpu-timed-")) / "stats.json"
    llm = _engine(config, profile, model, stats)
    S = Scripts(llm.get_tokenizer())
    loop = None
    if config == "loop-in-process":
        from vllm_seqhooks.loops.format_loop import FormatLoop

        loop = FormatLoop(llm, FORMAT)
    rows = []
    for n in sizes:
        rng = random.Random(n)
        prompts, params, critical = [], [], []
        for _ in range(n):
            trace = draw_trace(rng, scale=scale)
            text = trace_text(trace, rng)
            critical.append(trace.critical_path_tokens)
            prompts.append(S("".join(rng.choice("abcdefgh ") for _ in range(PROMPT_TOKENS))))
            params.append(S.params(text.sequential, max_tokens=4000) if config == "sequential"
                          else S.params(text.parent, text.children, max_tokens=4000))
        before = counters(stats)
        t0 = time.perf_counter()
        if loop is not None:
            tokens = sum(len(r.token_ids) for r in loop.generate(prompts, params))
        else:
            tokens = sum(len(o.outputs[0].token_ids)
                         for o in llm.generate(prompts, params, use_tqdm=False))
        wall = time.perf_counter() - t0
        after = counters(stats)
        d = {k: after[k] - before[k] for k in after if not isinstance(after[k], bool)}
        rows.append(dict(
            config=config, profile=profile, families=n, scale=scale, wall_s=round(wall, 2),
            modelled_gpu_s=round(d["modelled_gpu_s"], 2), engine_steps=d["steps"],
            request_steps=d["request_steps"], output_tokens=tokens,
            longest_critical_path_tokens=max(critical),
            scheduler_us_per_step=round(d["sched_scheduler_cpu_s"] / max(1, d["sched_steps"]) * 1e6, 1),
            scheduler_us_per_request_step=round(
                d["sched_scheduler_cpu_s"] / max(1, d["sched_request_steps"]) * 1e6, 2),
            modelled_ms_per_step=round(d["modelled_gpu_s"] / max(1, d["steps"]) * 1e3, 2)))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", choices=CONFIGS)
    parser.add_argument("profile")
    parser.add_argument("sizes", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--scale", type=float, default=0.125)
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    run(args.config, args.profile, args.sizes, args.scale)


if __name__ == "__main__":
    main()
