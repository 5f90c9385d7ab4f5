"""The GPU-timed grid (issue 52):

    python -m benchmarks.gpu_timed [--smoke] [--profiles P,...] [--sizes 1,16,64,256]
        [--scale S] [--plain-repeats N] [--time-scale auto|K] [--out DIR] [--write-docs]

Two GPU-timed servers (stock, and hooks with ThreadWeaver's format) and an
in-process ``vllm_seqhooks.LLM`` (:mod:`.in_process`), started once and
priced for each profile in turn (``h100-sxm/qwen3-8b`` and the others of
:mod:`.profiles`; the worker's ``set_profile``), run, for each profile at
each number of families at once, the configurations of :mod:`.grid`:
sequential, its A/A repeat, the client loop, native over HTTP, native in-process, and plain
traffic (nothing forking) on the stock and on the hooks server, every one
of a size at the time scale its ``sequential`` run chose
(:mod:`.time_scale`: a host fast enough to keep up). Prints a JSON row per
run and writes ``gpu_timed.json``, ``gpu_timed.md`` and the chart
``gpu_timed.png`` (with matplotlib) into ``--out`` (a new temporary
directory by default); ``--write-docs`` also writes them into
``docs/benchmarks/``. ``--smoke``: one profile, 2 families, short traces:
a check that every configuration runs, not figures.
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


class Engines:
    """The grid's engines: the stock and the hooks server and the
    in-process ``LLM``, started at once (the servers boot in their own
    processes while this one builds the ``LLM``) and priced for one profile
    at a time (:meth:`set_profile`), and each one's counters
    (the worker's and the scheduler's files, read once after each run, when
    every engine is idle again (``idle_s``, :data:`.grid.IDLE_ENGINES_S`): a
    run's "before" is the previous run's "after" on that engine)."""

    def __init__(self, model: str, profile: str, workdir: Path, scale: float,
                 idle_s: float) -> None:
        from benchmarks.gpu_timed import grid, in_process

        self.idle_s = idle_s
        self.servers, self.llm = {}, None
        with ThreadPoolExecutor(2) as pool:
            starting = {name: pool.submit(grid.server, model, profile, workdir, name,
                                          trace_mode=mode, scale=scale, hooks=name == "native")
                        for name, mode in (("stock", "sequential"), ("native", "native"))}
            try:
                self.llm, llm_stats = in_process.start_engine(
                    model, profile, workdir, scale=scale, prompt_tokens=grid.PROMPT_TOKENS)
            finally:
                for name, future in starting.items():
                    if future.exception() is None:
                        self.servers[name] = future.result()
        failed = [f.exception() for f in starting.values() if f.exception() is not None]
        if failed or self.llm is None:
            self.stop()
            if failed:
                raise failed[0]
        self.stats = {"stock": self.servers["stock"][1], "native": self.servers["native"][1],
                      "native-in-process": llm_stats}
        self._last = {path: grid.counters(path) for path in self.stats.values()}
        self.time_scale = 1.0

    def set_profile(self, profile: str) -> None:
        """Every engine's later steps take ``profile``'s time, at time scale 1
        (a profile's search for its scale starts there)."""
        from benchmarks.gpu_timed.worker_rpc import call

        for engine in [srv.url for srv, _ in self.servers.values()] + [self.llm]:
            if call(engine, "set_profile", profile) != [profile]:
                raise RuntimeError(f"the profile was not set to {profile!r} on {engine}")
        self.set_time_scale(1.0)

    def engine_for(self, config: str):
        """What runs ``config``: a server's URL, or the in-process ``LLM``."""
        return self.llm if config == "native-in-process" else self.server_for(config).url

    def set_time_scale(self, scale: float) -> None:
        """Every engine's later steps wait ``scale`` times their modelled
        time (:mod:`.time_scale`); the rows divide their times by it."""
        from benchmarks.gpu_timed.time_scale import set_scale

        for srv, _ in self.servers.values():
            set_scale(srv.url, scale)
        set_scale(self.llm, scale)
        self.time_scale = scale

    def server_for(self, config: str):
        return self.servers["native" if config in ("native", "plain-hooks") else "stock"][0]

    def reset_prefix_cache(self, config: str) -> None:
        """Before each run: the engine that runs ``config`` has no prompt
        cached by an earlier run (:func:`.grid.reset_prefix_cache`)."""
        from benchmarks.gpu_timed import grid

        if config == "native-in-process":
            if not self.llm.reset_prefix_cache():
                raise RuntimeError("the in-process engine's prefix cache could not be reset")
        else:
            grid.reset_prefix_cache(self.server_for(config).url)

    def counters_around(self, config: str) -> tuple[dict, dict]:
        """(before, after) the run of ``config`` that just ended."""
        from benchmarks.gpu_timed import grid

        path = self.stats.get({"plain-hooks": "native"}.get(config, config),
                              self.stats["stock"])
        before = self._last[path]
        self._last[path] = grid.counters_after_run(path, before, self.idle_s)
        return before, self._last[path]

    def stop(self) -> None:
        if self.llm is not None:
            self.llm.shutdown()
        for srv, _ in self.servers.values():
            srv.stop()


#: The configurations with one request per family: their client's latencies
#: are compared with the requests' spans on the modelled GPU (``client_lag``).
ONE_REQUEST_A_FAMILY = ("sequential", "sequential-aa")


def run_config(engines: Engines, config: str, profile: str, fams: list, model: str, book,
               tok, workdir: Path) -> dict:
    from benchmarks.gpu_timed import grid, in_process
    from benchmarks.gpu_timed.time_scale import client_lag, take_spans

    engines.reset_prefix_cache(config)
    if config in ONE_REQUEST_A_FAMILY:
        take_spans(engines.engine_for(config))  # (the earlier runs' requests)
    if config == "loop":
        run = grid.loop_run(engines.server_for(config).url, model, fams, book, tok)
    elif config == "native-in-process":
        run = in_process.run(engines.llm, fams,
                             grid.MAX_MODEL_LEN - len(fams[0].prompt_ids) - 1)
    else:
        run = grid.bench_serve(engines.server_for(config).url, model, fams, workdir,
                               plain=config.startswith("plain"))
    out = grid.row(config, profile, fams, run, *engines.counters_around(config),
                   time_scale=engines.time_scale)
    if config in ONE_REQUEST_A_FAMILY:
        out["client_lag"] = round(client_lag(out["family_latency_p50_s"],
                                             take_spans(engines.engine_for(config)),
                                             engines.time_scale), 3)
    print(json.dumps(out), flush=True)
    return out


def sequential_at_a_scale(engines: Engines, scale: float | None, run) -> dict:
    """The size's first run, ``sequential``, at the fixed ``scale``, or (None)
    at the time scale the host keeps up at: from the engines' current one,
    doubled while it did not (:func:`.time_scale.next_scale`); its row keeps
    every scale tried, with the GPU's busy share and the client's lag at each."""
    from benchmarks.gpu_timed.time_scale import busy_fraction, next_scale

    tried, trying = [], scale or engines.time_scale
    while trying is not None:
        engines.set_time_scale(trying)
        out = run()
        busy = busy_fraction(out["modelled_gpu_s"], out["wall_s"], trying)
        tried.append({"time_scale": trying, "gpu_busy": round(busy, 3),
                      "client_lag": out["client_lag"]})
        trying = None if scale else next_scale(trying, busy, out["client_lag"])
        if trying is not None:
            print(f"the host fell behind at time scale {tried[-1]['time_scale']} (GPU busy "
                  f"{busy:.0%}, the client's p50 {out['client_lag']} times the engine's): "
                  f"again at {trying}", flush=True)
    return {**out, "time_scales_tried": tried}


def run_size(engines: Engines, profile: str, fams: list, model: str, book, tok,
             workdir: Path, plain_repeats: int, scale: float | None) -> list[dict]:
    from benchmarks.gpu_timed import grid

    def one(config: str) -> dict:
        return run_config(engines, config, profile, fams, model, book, tok, workdir)

    rows = [sequential_at_a_scale(engines, scale, lambda: one("sequential"))]
    rows += [one(config) for config in grid.CONFIGS
             if config != "sequential" and not config.startswith("plain")]
    return rows + plain_rows(engines, profile, fams, model, workdir, plain_repeats)


def plain_rows(engines: Engines, profile: str, fams: list, model: str,
               workdir: Path, repeats: int) -> list[dict]:
    """Plain traffic on the stock and the hooks server, alternately
    ``repeats`` times (a few seconds each): for each, the
    run with the median scheduler CPU per step, with the range over the
    repeats (how far apart two runs of the same server fall)."""
    from benchmarks.gpu_timed import grid

    runs: dict[str, list[dict]] = {"plain-stock": [], "plain-hooks": []}
    for _ in range(repeats):
        for config, done in runs.items():
            engines.reset_prefix_cache(config)
            run = grid.bench_serve(engines.server_for(config).url, model, fams, workdir,
                                   plain=True)
            done.append(grid.row(config, profile, fams, run, *engines.counters_around(config),
                                 time_scale=engines.time_scale))
    rows = [grid.median_row(done, "engine_cpu_per_step_ms") for done in runs.values()]
    for r in rows:
        print(json.dumps(r), flush=True)
    return rows


def run_grid(profiles: list[str], sizes: list[int], scale: float, workdir: Path,
             plain_repeats: int, idle_s: float, time_scale: float | None) -> list[dict]:
    """Every profile's sizes on one set of engines (starting the three took
    about 30 s here on 2026-12-06, once a profile until then)."""
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
    own_cpus = os.sched_getaffinity(0)  # (the engines move this process to the frontend half)
    engines = Engines(model, profiles[0], workdir, scale, idle_s)
    rows = []
    try:
        for profile in profiles:
            engines.set_profile(profile)
            first = 0
            for n in sizes:
                fams = grid.families(tok, book, n, first)
                first += 10 * n + 1000
                rows += run_size(engines, profile, fams, model, book, tok, workdir,
                                 plain_repeats, time_scale)
    finally:
        engines.stop()
        os.sched_setaffinity(0, own_cpus)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--profiles", default="h100-sxm/qwen2.5-1.5b,h100-sxm/qwen3-8b,"
                        "h100-sxm/qwen3-32b")
    parser.add_argument("--sizes", default="1,16,64,256")
    parser.add_argument("--scale", type=float, default=0.035)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--plain-repeats", type=int, default=1,
                        help="plain-traffic runs per server and size, alternately (the row: "
                        "the median's); hooks / stock on plain traffic is measured over fresh "
                        "pairs of servers by benchmarks.gpu_timed.plain_pairs")
    parser.add_argument("--time-scale", default="auto",
                        help="each modelled step waits this many times its time (a host this "
                        "many times as fast; times are divided back), or 'auto': per size, "
                        "doubled from 1 while the host falls behind (benchmarks/gpu_timed/"
                        "time_scale.py)")
    args = parser.parse_args(argv)
    from benchmarks.gpu_timed.grid import IDLE_ENGINES_S

    if args.smoke:
        args.profiles, args.sizes, args.scale = "h100-sxm/qwen2.5-1.5b", "2", 0.01
        args.time_scale = "1"  # (its figures are not compared: no search)
    time_scale = None if args.time_scale == "auto" else float(args.time_scale)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = args.out or Path(tempfile.mkdtemp(prefix="seqhooks-gpu-timed-grid-"))
    sizes = [int(x) for x in args.sizes.split(",")]
    rows = run_grid(args.profiles.split(","), sizes, args.scale, out / "engines",
                    plain_repeats=args.plain_repeats,
                    # (the smoke's figures are not compared: no wait)
                    idle_s=0.0 if args.smoke else IDLE_ENGINES_S, time_scale=time_scale)
    command = "python -m benchmarks.gpu_timed " + " ".join(argv if argv is not None
                                                            else sys.argv[1:])
    from benchmarks.gpu_timed.chart import chart
    from benchmarks.gpu_timed.report import markdown

    (out / "gpu_timed.json").write_text(json.dumps({"command": command, "rows": rows},
                                                   indent=1) + "\n")
    (out / "gpu_timed.md").write_text(markdown(rows, command))
    names = ["gpu_timed.md", "gpu_timed.json"]
    if chart(rows, command, out / "gpu_timed.png"):
        names.append("gpu_timed.png")
    print(f"wrote {', '.join(str(out / n) for n in names)}")
    if args.write_docs:
        for name in names:
            shutil.copy(out / name, ROOT / "docs" / "benchmarks" / name)
        print("and into docs/benchmarks/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
