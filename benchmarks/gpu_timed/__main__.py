"""The GPU-timed grid (issue 52):

    python -m benchmarks.gpu_timed [--smoke] [--profiles P,...] [--sizes 1,16,64,256]
        [--scale S] [--out DIR] [--write-docs]

For each profile (``h100-sxm/qwen3-8b`` and the others of :mod:`.profiles`),
two GPU-timed servers (stock, and hooks with ThreadWeaver's format) and, at
each number of families at once, the configurations of :mod:`.grid`:
sequential, its A/A repeat, the client loop, native. Prints a JSON row per
run and writes ``gpu_timed.json`` and ``gpu_timed.md`` into ``--out`` (a new
temporary directory by default); ``--write-docs`` also writes them into
``docs/benchmarks/``. ``--smoke``: one profile, 1 and 2 families, short
traces: a check that every configuration runs, not figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_profile(profile: str, sizes: list[int], scale: float, workdir: Path) -> list[dict]:
    from transformers import AutoTokenizer

    from vllm_seqhooks.scripted.params import encode_script
    from vllm_seqhooks.scripted.tiny_model import EOS_ID, build_tiny_model

    from benchmarks.common import default_cache_dir
    from benchmarks.gpu_timed import grid
    from benchmarks.gpu_timed.trace_book import TraceBook

    model = str(build_tiny_model(default_cache_dir() / "tiny-model"))
    tok = AutoTokenizer.from_pretrained(model)
    book = TraceBook("native", scale, grid.PROMPT_TOKENS, EOS_ID,
                     lambda text: encode_script(tok, text))
    workdir.mkdir(parents=True, exist_ok=True)
    own_cpus = os.sched_getaffinity(0)  # (grid.server moves this process to the frontend half)
    with ThreadPoolExecutor(2) as pool:  # (both start at once: half the wait)
        starting = [pool.submit(grid.server, model, profile, workdir, name, trace_mode=mode,
                                scale=scale, hooks=name == "native")
                    for name, mode in (("stock", "sequential"), ("native", "native"))]
        started = [f.exception() or f.result() for f in starting]
    failed = [s for s in started if isinstance(s, BaseException)]
    if failed:
        for s in started:
            if not isinstance(s, BaseException):
                s[0].stop()
        raise failed[0]
    (stock, stock_stats), (native, native_stats) = started
    rows, first = [], 0
    try:
        for n in sizes:
            fams = grid.families(tok, book, n, first)
            first += 10 * n + 1000
            for config in grid.CONFIGS:
                url, stats = (native.url, native_stats) if config == "native" else (
                    stock.url, stock_stats)
                before = grid.counters(stats)
                if config == "loop":
                    run = grid.loop_run(url, model, fams, book, tok)
                else:
                    run = grid.bench_serve(url, model, fams, workdir)
                rows.append(grid.row(config, profile, fams, run, before, grid.counters(stats)))
                print(json.dumps(rows[-1]), flush=True)
    finally:
        native.stop()
        stock.stop()
        os.sched_setaffinity(0, own_cpus)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--profiles", default="h100-sxm/qwen2.5-1.5b,h100-sxm/qwen3-8b,"
                        "h100-sxm/qwen3-32b")
    parser.add_argument("--sizes", default="1,16,64,256")
    parser.add_argument("--scale", type=float, default=0.125)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args(argv)
    if args.smoke:
        args.profiles, args.sizes, args.scale = "h100-sxm/qwen2.5-1.5b", "1,2", 0.02
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = args.out or Path(tempfile.mkdtemp(prefix="seqhooks-gpu-timed-grid-"))
    sizes = [int(x) for x in args.sizes.split(",")]
    rows = []
    for profile in args.profiles.split(","):
        rows += run_profile(profile, sizes, args.scale, out / profile.replace("/", "_"))
    command = "python -m benchmarks.gpu_timed " + " ".join(argv if argv is not None
                                                            else sys.argv[1:])
    from benchmarks.gpu_timed.report import markdown

    (out / "gpu_timed.json").write_text(json.dumps({"command": command, "rows": rows},
                                                   indent=1) + "\n")
    (out / "gpu_timed.md").write_text(markdown(rows, command))
    print(f"wrote {out / 'gpu_timed.md'} and {out / 'gpu_timed.json'}")
    if args.write_docs:
        for name in ("gpu_timed.md", "gpu_timed.json"):
            shutil.copy(out / name, ROOT / "docs" / "benchmarks" / name)
        print("and into docs/benchmarks/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
