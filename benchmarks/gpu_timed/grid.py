"""One profile's side of the GPU-timed grid (issue 52): ThreadWeaver-format
families on GPU-timed servers, each configuration at each number of
families at once, as rows of figures.

Configurations (async scheduling on; over HTTP, one ``vllm serve`` per
engine kind started once per profile, except ``native-in-process``):

* ``sequential``: a stock server; each family is one request writing its
  trace sequentially (the anchors' baseline), sent by ``vllm bench serve``
  (vLLM's own load generator, called as a library) with a custom dataset of
  plain prompts; the server's :mod:`.trace_book` picks each family from its
  prompt.
* ``sequential-aa``: the same run again on the same server: the A/A control.
* ``loop``: ThreadWeaver's client loop (:func:`benchmarks.formats.http_loop_family`,
  this project's loop) over HTTP against the stock server, every family at
  once; its requests carry their scripts.
* ``native``: a server with hooks (ThreadWeaver's format), one request per
  family, by ``vllm bench serve`` as ``sequential``.
* ``native-in-process``: ``vllm_seqhooks.LLM`` with the same format, every
  family added at once (:mod:`.in_process`).
* ``plain-stock``, ``plain-hooks``: plain traffic, nothing forking: one
  request per family writing :data:`PLAIN_TOKENS` filler tokens, on the
  stock and on the hooks server (the scheduler's cost of hooks that are on
  and unused).

Every family of a size has the same trace in every configuration (its
prompt picks it). Each server's engine processes run on half of the CPUs,
its API server and the clients on the other half (:mod:`.host_split`: as on
a GPU host, the engine's spinning wait for the GPU does not take the
frontend's CPU). A row: per-family latency p50 / p99 (modelled seconds: the
server's modelled GPU keeps the wall clock at GPU speed, times the size's
time scale (:mod:`.time_scale`), while the host keeps up, ``host_kept_up``
says whether it did), output tokens/s, engine steps,
modelled GPU seconds, the scheduler's thread-CPU seconds (schedule, update
from output, add request: :mod:`.timed_scheduler`) and per step against the
modelled step, and the critical-path limit: each family's longest path
(sequential text, outlines, the longest thread of each block) at the run's
mean modelled step time, p50 over families (:func:`critical_path_tokens`).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.gpu_timed.engine_args import ENGINE_SIZE, serve_flags
from benchmarks.gpu_timed.stats_file import SETTLED_S
from benchmarks.gpu_timed.time_scale import busy_fraction
from benchmarks.gpu_timed.trace_book import PLAIN_KEY, TraceBook, prompt_text

FORMAT = {"format": "threadweaver", "max_child_depth": 1, "fork_min_tokens": 1}
CONFIGS = ("sequential", "sequential-aa", "loop", "native", "native-in-process",
           "plain-stock", "plain-hooks")
PROMPT_TOKENS = 64
#: Tokens each request of the plain-traffic runs writes (all at once, so the
#: same requests are live for about this many steps on both servers).
PLAIN_TOKENS = 192
#: vLLM's shared-memory queue readers spin for a second after their last
#: message (``shm_broadcast.SpinCondition``'s ``busy_loop_s``): a run that
#: starts this long after the last one ended has every other engine idle
#: (else the last run's engine spins on the engines' core into it: per-step
#: CPU of the same server differed by 10-20 % with the order of the runs).
IDLE_ENGINES_S = 1.1
MAX_MODEL_LEN = ENGINE_SIZE["max_model_len"]
#: The servers stream every 16th token (vLLM's ``--stream-interval``, "reduces
#: host overhead" in its help; a request's last tokens are sent when it
#: finishes, so a family's latency is the same): at 256 families on 1.5B, one
#: chunk per token was 256 chunks every 4 ms for the API server and
#: ``vllm bench serve`` on one core, and the run took 17.7 s of wall for 7.0
#: s of modelled GPU; with 16, 8.2 s (2026-12-04). The loop does not stream.
STREAM_INTERVAL = 16


@dataclass(frozen=True)
class Family:
    prompt: str
    prompt_ids: list[int]
    critical_path_tokens: int
    sequential_tokens: int


def families(tokenizer, book: TraceBook, n: int, first: int) -> list[Family]:
    """``n`` families from prompt ``first`` on, leaving out those whose
    sequential trace does not fit the context (the tail beyond the tiny
    model's 4,096 positions: a few at scale 0.125, said in the report)."""
    out, i = [], first
    while len(out) < n:
        prompt = prompt_text(i, PROMPT_TOKENS)
        i += 1
        ids = tokenizer(prompt).input_ids
        trace, text = book.family(ids)
        seq = len(book.encode(text.sequential))
        if len(ids) + seq + 1 <= MAX_MODEL_LEN:
            out.append(Family(prompt, ids, critical_path_tokens(book, trace, text), seq))
    return out


def critical_path_tokens(book: TraceBook, trace, text) -> int:
    """The tokens a family must sample one after another: the parent's own
    (sequential text, outlines, tags) and the longest thread of each block
    (children's keys count in promise order, block after block)."""
    lengths = [len(book.encode(text.children[str(k)])) for k in range(len(text.children))]
    longest, k = 0, 0
    for block in trace.blocks:
        longest += max(lengths[k:k + len(block)])
        k += len(block)
    return len(book.encode(text.parent)) + longest


def percentile(values: list[float], p: float) -> float:
    values = sorted(values)
    k = (len(values) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def bench_serve(url: str, model: str, fams: list[Family], workdir: Path, *,
                plain: bool = False) -> dict[str, Any]:
    """vLLM's ``vllm bench serve`` (its ``main``, called here) sending the
    families' prompts all at once; returns its result (per-request latencies
    kept). The prompts are vLLM's ``SampleRequest`` rows handed to it in
    place of a dataset's (``vllm bench serve``'s custom dataset reads JSONL
    with pandas, which vLLM's CPU build does not install): the same rows as
    ``dataset-N.jsonl`` in ``workdir``, which ``vllm bench serve --dataset-name
    custom --dataset-path ... --custom-output-len -1 --skip-chat-template``
    sends where pandas is installed. ``plain``: each request writes
    :data:`PLAIN_TOKENS` filler tokens, no family
    (:data:`.trace_book.PLAIN_KEY` in its ``vllm_xargs``)."""
    from vllm.benchmarks import serve
    from vllm.benchmarks.datasets import SampleRequest
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    budget = PLAIN_TOKENS if plain else MAX_MODEL_LEN - len(fams[0].prompt_ids) - 1
    dataset = workdir / f"dataset-{len(fams)}{'-plain' if plain else ''}.jsonl"
    dataset.write_text("".join(
        json.dumps({"prompt": f.prompt, "output_tokens": budget}) + "\n" for f in fams))
    rows = [SampleRequest(prompt=f.prompt, prompt_len=len(f.prompt_ids),
                          expected_output_len=budget, request_id=f"family-{i}")
            for i, f in enumerate(fams)]
    parser = FlexibleArgumentParser()
    serve.add_cli_args(parser)
    args = parser.parse_args([
        "--backend", "vllm", "--base-url", url, "--model", model, "--tokenizer", model,
        "--dataset-name", "custom", "--dataset-path", str(dataset), "--skip-chat-template",
        "--custom-output-len", "-1", "--num-prompts", str(len(fams)),
        "--max-concurrency", str(len(fams)), "--request-rate", "inf",
        "--ready-check-timeout-sec", "0", "--num-warmups", "0", "--disable-tqdm",
        "--save-detailed", "--percentile-metrics", "e2el", "--metric-percentiles", "50,99",
        "--seed", "0",
        *(["--extra-body", json.dumps({"vllm_xargs": {PLAIN_KEY: 1}})] if plain else [])])
    get_samples = serve.get_samples
    serve.get_samples = lambda args, tokenizer: rows
    try:
        result = serve.main(args)
    finally:
        serve.get_samples = get_samples
    if result.get("failed"):
        raise RuntimeError(f"vllm bench serve: {result['failed']} requests failed: "
                           f"{[e for e in result.get('errors', []) if e][:3]}")
    return result


async def _loop_run(url: str, model: str, fams: list[Family], book: TraceBook, S, hooks,
                    codec) -> tuple[list[float], int]:
    from openai import AsyncOpenAI

    from benchmarks.formats import http_loop_family

    client = AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=3600)

    async def one(f: Family) -> tuple[float, int]:
        _, text = book.family(f.prompt_ids)
        sp = S.params(text.parent, text.children, max_tokens=MAX_MODEL_LEN - len(f.prompt_ids))
        t0 = time.perf_counter()
        r = await http_loop_family(client, model, hooks, codec, f.prompt_ids, sp)
        return time.perf_counter() - t0, len(r["tokens"])

    try:
        done = await asyncio.gather(*[one(f) for f in fams])
    finally:
        await client.close()
    return [d[0] for d in done], sum(d[1] for d in done)


def loop_run(url: str, model: str, fams: list[Family], book: TraceBook, tokenizer) -> dict:
    from vllm_seqhooks.config.presets import expand
    from vllm_seqhooks.config.special_kwargs import SpecialKwargs
    from vllm_seqhooks.formats.text_codec import TextCodec
    from vllm_seqhooks.scripted.llm import Scripts

    hooks = SpecialKwargs(**expand(FORMAT))
    codec = TextCodec.from_tokenizer(tokenizer, 128)
    cpu0, t0 = time.process_time(), time.perf_counter()
    latencies, tokens = asyncio.run(_loop_run(url, model, fams, book, Scripts(tokenizer),
                                              hooks, codec))
    return {"latencies": latencies, "total_output_tokens": tokens,
            "duration": time.perf_counter() - t0, "client_cpu_s": time.process_time() - cpu0}


def reset_prefix_cache(url: str) -> None:
    """Empty the server's prefix cache (vLLM's ``POST /reset_prefix_cache``,
    served with ``VLLM_SERVER_DEV_MODE=1``) so that a run does not reuse the
    blocks of the prompts an earlier run on that server cached: every run
    prefills its prompts, as the first one did (else the A/A repeat skipped
    the prefill of its prompts: 1.7 s of modelled GPU of 32B at 256
    families, its p50 4 % lower)."""
    import urllib.request

    req = urllib.request.Request(url + "/reset_prefix_cache", data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        if not json.loads(r.read()).get("success"):
            raise RuntimeError(f"{url}: the prefix cache could not be reset")


def _read(path: Path) -> dict[str, float]:
    return json.loads(path.read_text())


def counters(stats: Path, wait_s: float = SETTLED_S) -> dict[str, float]:
    """The server's counters ``wait_s`` (at least :data:`SETTLED_S`: the
    worker's and the scheduler's files catch up) after its last run."""
    time.sleep(max(wait_s, SETTLED_S))
    return {**_read(stats), **{f"sched_{k}": v for k, v in _read(Path(f"{stats}.sched")).items()}}


def counters_after_run(stats: Path, before: dict, wait_s: float = SETTLED_S,
                       timeout_s: float = 30.0) -> dict[str, float]:
    """:func:`counters` once the scheduler's file shows the run's steps (its
    writer thread once lagged a busy engine core by more than a second: the
    run's row would have read as no step), else an error after ``timeout_s``."""
    now = counters(stats, wait_s)
    deadline = time.monotonic() + timeout_s
    while now["sched_steps"] == before["sched_steps"]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{stats}: no step counted {timeout_s:.0f} s after a run")
        now = counters(stats)
    return now


def median_row(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The row with the median ``key`` (the lower middle one of an even
    number), with ``key``'s range over ``rows`` as ``<key>_range``."""
    ranked = sorted(rows, key=lambda r: r[key])
    return {**ranked[(len(ranked) - 1) // 2], f"{key}_range": [ranked[0][key], ranked[-1][key]],
            "repeats": len(rows)}


def row(config: str, profile: str, fams: list[Family], run: dict, before: dict,
        after: dict, time_scale: float = 1.0) -> dict[str, Any]:
    """A run's figures. Its latencies, duration and tokens/s are modelled
    seconds: the wall clock's divided by ``time_scale`` (:mod:`.time_scale`);
    ``wall_s`` is this host's wall time, CPU figures are this host's."""
    d = {k: after[k] - before[k] for k in after if not isinstance(after[k], bool)}
    steps = max(1, d["steps"])
    step_s = d["modelled_gpu_s"] / steps
    sched = d["sched_scheduler_cpu_s"]
    lat = [t / time_scale for t in run["latencies"]]
    duration = run["duration"] / time_scale
    critical = [f.critical_path_tokens * step_s for f in fams]
    out = dict(
        profile=profile, config=config, families=len(fams), time_scale=time_scale,
        family_latency_p50_s=round(percentile(lat, 50), 3),
        family_latency_p99_s=round(percentile(lat, 99), 3),
        tokens_per_s=round(run["total_output_tokens"] / duration, 1),
        output_tokens=run["total_output_tokens"], wall_s=round(run["duration"], 3),
        engine_steps=d["steps"], request_steps=d["request_steps"],
        plain_steps=d.get("sched_plain_steps"),
        modelled_gpu_s=round(d["modelled_gpu_s"], 3),
        host_kept_up=busy_fraction(d["modelled_gpu_s"], run["duration"], time_scale) >= 0.9,
        engine_cpu_s=round(sched, 4),
        engine_cpu_per_step_ms=round(sched / steps * 1e3, 4),
        modelled_step_ms=round(step_s * 1e3, 3),
        engine_cpu_per_request_step_us=round(sched / max(1, d["sched_request_steps"]) * 1e6, 2),
        critical_path_s=None if config.startswith("plain") else round(percentile(critical, 50), 3))
    if "client_cpu_s" in run:
        out["loop_client_cpu_s"] = round(run["client_cpu_s"], 3)
        # the loop's cost per request-step with its own Python counted
        out["loop_cpu_per_request_step_us"] = round(
            (sched + run["client_cpu_s"]) / max(1, d["sched_request_steps"]) * 1e6, 2)
    return out


def server(model: str, profile: str, workdir: Path, name: str, *, trace_mode: str,
           scale: float, hooks: bool, split: bool = True):
    from vllm_seqhooks.local_server import start_on_free_port

    from benchmarks.gpu_timed.host_split import split_host

    stats = workdir / f"{name}.stats.json"
    hook_flags = (["--seqhooks", FORMAT["format"], "--max-child-depth", "1",
                   "--fork-min-tokens", "1"] if hooks else [])

    def command(port: int) -> list[str]:
        return [sys.executable, "-m", "benchmarks.gpu_timed.serve", model, "--profile", profile,
                "--filler-token", "40", "--stats-path", str(stats),
                "--scheduler-stats-path", f"{stats}.sched", "--trace-mode", trace_mode,
                "--trace-scale", str(scale), "--trace-prompt-tokens", str(PROMPT_TOKENS),
                "--host", "127.0.0.1", "--port", str(port), *serve_flags(ENGINE_SIZE),
                "--enable-prompt-tokens-details", "--stream-interval", str(STREAM_INTERVAL),
                "--disable-log-stats", "--uvicorn-log-level", "warning", *hook_flags]

    # Connections kept open for the whole run: with uvicorn's 5 s default,
    # the loop's client reused a connection the server was closing after an
    # idle spell (httpx ReadError, at 64 families, 2 runs of 3).
    # VLLM_SERVER_DEV_MODE: vLLM's /reset_prefix_cache (reset_prefix_cache).
    env = {**os.environ, "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "3600", "VLLM_SERVER_DEV_MODE": "1"}
    srv = start_on_free_port(command, log_path=workdir / f"{name}.log", timeout=600, env=env)
    if split:
        split_host(srv.proc.pid)
    return srv, stats
