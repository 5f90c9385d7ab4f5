"""Plain traffic on fresh pairs of GPU-timed servers (issue 52): what hooks
that are on and unused cost the scheduler per step, over as many server
processes as it takes to see it.

    python -m benchmarks.gpu_timed.plain_pairs [--profile P] [--families N]
        [--pairs K] [--runs R] [--out FILE]

The grid's plain rows compare one stock and one hooks server; two processes
of the same server differ by several per cent in scheduler CPU per step
(their memory laid out differently: the same comparison gave 0.95 and 1.13
on two fresh pairs), more than the 5 % asked. Here each of ``--pairs``
pairs of fresh servers (stock and hooks, started together, the engines on
their own CPU as in the grid) serves ``--runs`` plain runs each, alternately
(:func:`.grid.bench_serve` with ``plain``: ``N`` requests at once writing
:data:`.grid.PLAIN_TOKENS` filler tokens, nothing forking, each run after
:data:`.grid.IDLE_ENGINES_S` with the prefix cache empty). Per pair: the
median scheduler CPU per step of each server and their ratio. Reported: the
median of the pairs' ratios with its range, and the A/A control: stock
against stock, each pair's stock server against the next pair's; and the
median ratio of each timed call (:data:`CALLS`), ``schedule`` being the same
code on both servers while nothing forks.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

KINDS = ("stock", "hooks")
#: The scheduler's timed calls (:mod:`.timed_scheduler`). While nothing
#: forks, the hook scheduler's ``schedule`` is vLLM's own method bound on it:
#: the same code on both servers, so its ratio within a pair shows how far
#: two processes differ on the same work.
CALLS = ("schedule", "update_from_output", "add_request")


def per_step_us(before: dict, after: dict, counter: str = "scheduler_cpu_s") -> float:
    steps = after["sched_steps"] - before["sched_steps"]
    return (after[f"sched_{counter}"] - before[f"sched_{counter}"]) / steps * 1e6


def one_pair(model: str, profile: str, fams: list, workdir: Path, runs: int) -> dict:
    """Per server of a fresh pair: the scheduler CPU per step (us) of each
    run, and (``calls``) each timed call's."""
    from benchmarks.gpu_timed import grid

    workdir.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(2) as pool:
        starting = {kind: pool.submit(grid.server, model, profile, workdir, kind,
                                      trace_mode="native" if kind == "hooks" else "sequential",
                                      scale=0.01, hooks=kind == "hooks")
                    for kind in KINDS}
        servers = {kind: f.result() for kind, f in starting.items()}
    try:
        last = {kind: grid.counters(stats) for kind, (_, stats) in servers.items()}
        out: dict = {kind: [] for kind in KINDS}
        out["calls"] = {kind: [] for kind in KINDS}
        for _ in range(runs):
            for kind, (srv, stats) in servers.items():
                grid.reset_prefix_cache(srv.url)
                grid.bench_serve(srv.url, model, fams, workdir, plain=True)
                now = grid.counters_after_run(stats, last[kind], grid.IDLE_ENGINES_S)
                out[kind].append(round(per_step_us(last[kind], now), 2))
                out["calls"][kind].append({c: round(per_step_us(last[kind], now, f"{c}_cpu_s"), 2)
                                          for c in CALLS})
                last[kind] = now
        return out
    finally:
        for srv, _ in servers.values():
            srv.stop()


def summary(pairs: list[dict]) -> dict:
    """Each pair's median per server and ratio; the median and range of the
    ratios; the A/A: each pair's stock median over the next pair's; and,
    for pairs with ``calls``, the median over pairs of each call's ratio."""
    medians = [{kind: statistics.median(p[kind]) for kind in KINDS} for p in pairs]
    ratios = [m["hooks"] / m["stock"] for m in medians]
    aa = [a["stock"] / b["stock"] for a, b in zip(medians, medians[1:])]
    per_call = {}
    if all("calls" in p for p in pairs):
        for c in CALLS:
            call_ratios = [
                statistics.median(r[c] for r in p["calls"]["hooks"])
                / statistics.median(r[c] for r in p["calls"]["stock"]) for p in pairs]
            per_call[c] = round(statistics.median(call_ratios), 3)
    return {**({"hooks_vs_stock_per_call_median": per_call} if per_call else {}),
        "pair_medians_us": [{k: round(v, 2) for k, v in m.items()} for m in medians],
        "hooks_vs_stock": [round(r, 3) for r in ratios],
        "hooks_vs_stock_median": round(statistics.median(ratios), 3),
        "hooks_vs_stock_range": [round(min(ratios), 3), round(max(ratios), 3)],
        "aa_stock_vs_next_stock": [round(r, 3) for r in aa],
        "aa_median": round(statistics.median(aa), 3) if aa else None,
        "aa_range": [round(min(aa), 3), round(max(aa), 3)] if aa else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="h100-sxm/qwen2.5-1.5b")
    parser.add_argument("--families", type=int, default=1)
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, help="write the result (JSON) here too")
    args = parser.parse_args(argv)
    if args.pairs < 2:
        parser.error("--pairs: at least 2 (the A/A compares one pair's stock with the next's)")
    from transformers import AutoTokenizer

    from vllm_seqhooks.scripted.params import encode_script
    from vllm_seqhooks.scripted.tiny_model import EOS_ID, build_tiny_model

    from benchmarks.common import default_cache_dir
    from benchmarks.gpu_timed import grid
    from benchmarks.gpu_timed.trace_book import TraceBook

    model = str(build_tiny_model(default_cache_dir() / "tiny-model"))
    tok = AutoTokenizer.from_pretrained(model)
    book = TraceBook("native", 0.01, grid.PROMPT_TOKENS, EOS_ID,
                     lambda text: encode_script(tok, text))
    fams = grid.families(tok, book, args.families, 0)
    workdir = Path(tempfile.mkdtemp(prefix="seqhooks-plain-pairs-"))
    t0 = time.perf_counter()
    pairs = []
    for i in range(args.pairs):
        pairs.append(one_pair(model, args.profile, fams, workdir / f"pair-{i}", args.runs))
        print(json.dumps({"pair": i, **pairs[-1]}), flush=True)
    command = "python -m benchmarks.gpu_timed.plain_pairs " + " ".join(
        argv if argv is not None else sys.argv[1:])
    result = {"command": command, "profile": args.profile, "families": args.families,
              "plain_tokens": grid.PLAIN_TOKENS, "runs_per_server": args.runs,
              "seconds": round(time.perf_counter() - t0), "pairs": pairs, **summary(pairs)}
    print(json.dumps({k: v for k, v in result.items() if k != "pairs"}), flush=True)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
