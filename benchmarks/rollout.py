"""RL rollouts (GRPO groups): native fork/join against the format's client loop.

    python -m benchmarks.rollout --out docs/benchmarks     # default size (rollout.md)
    python -m benchmarks.rollout --smoke                    # seconds
    python -m benchmarks.rollout --no-http                  # in-process only

The embedded trained ThreadWeaver-format model (:mod:`vllm_seqhooks.tasks.threadweaver`)
samples ``n`` completions of each held-out problem at temperature 1, as an RL
trainer's rollout step does: ``native`` (``vllm_seqhooks.LLM(model,
special_kwargs="auto")``, each prompt once with ``SamplingParams(n=n)``) against
``loop`` (:class:`~vllm_seqhooks.loops.format_loop.FormatLoop` over a stock
``vllm.LLM`` with the native engine's special kwargs; FormatLoop runs every
request with ``n=1``, so each prompt is sent ``n`` times); each with
``logprobs=0`` (what verl asks) and without (``_nolp``); ``loop_b`` is ``loop``
again (the A/A control). In-process and over HTTP (``vllm serve --seqhooks
auto`` against :mod:`benchmarks.formats`' OpenAI-client loop over a stock
``vllm serve``). Counted on both sides: the tokens the policy sampled (parents
and children, not the text inserted at forks and joins); the reward
(:func:`vllm_seqhooks.tasks.threadweaver.summarize`). The page says more.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from benchmarks.common import (EngineProbe, close_engine, environment, exit_leaving_engines,
                               fmt_spread, git_commit, interleaved, leave_engines_to_exit,
                               setup_env, spread)
from vllm_seqhooks.tasks import threadweaver as task

SIZES = {
    "smoke": dict(prompts=4, n=2, repeats=1, http_prompts=4, smoke=True),
    "default": dict(prompts=64, n=8, repeats=5, http_prompts=64),
}
CONFIGS = ("loop", "loop_b", "native", "native_nolp", "loop_nolp")
#: In-process also: native with fair share off (where native's time goes).
IN_PROCESS_CONFIGS = (*CONFIGS, "native_nofair")
BASELINE = "loop"
#: name -> (numerator, denominator): ratios taken within each repeat.
PAIRS = {
    "A/A control: loop_b / loop": ("loop_b", "loop"),
    "native / loop (logprobs=0)": ("native", "loop"),
    "native / loop (logprobs off)": ("native_nolp", "loop_nolp"),
    "logprobs=0 / off, native": ("native", "native_nolp"),
    "logprobs=0 / off, loop": ("loop", "loop_nolp"),
    "native, fair share off / on": ("native_nofair", "native"),
}
#: Engine counters recorded in-process (benchmarks.common.EngineProbe).
COUNTERS = ("prefill_tokens", "preemptions", "steps", "scheduler_s")
TEMPERATURE = 1.0


def sampling(n: int, logprobs: int | None, temperature: float = TEMPERATURE):
    from vllm import SamplingParams

    return SamplingParams(n=n, temperature=temperature, max_tokens=task.PARENT_MAX_TOKENS,
                          logprobs=logprobs)


def logprobs_of(config: str) -> int | None:
    return None if config.endswith("_nolp") else 0


def problems_for(count: int, repeat: int):
    """The problems of one repeat (every configuration gets the same; a new
    set each repeat, as each RL step samples new prompts)."""
    return task.heldout_problems(count, seed=task.HELDOUT_SEED + repeat)


# -------------------------------------------------------------------- counting
def native_sampled(traces: list[Any] | None, token_ids: list[list[int]]) -> list[int]:
    """Tokens sampled per completion of a native output: its trace's
    ``family_sampled_tokens``, or its length where no hook fired."""
    if traces is None or not any(traces):  # no completion forked: no trace at all
        traces = [None] * len(token_ids)
    if len(traces) != len(token_ids):
        raise RuntimeError(f"{len(token_ids)} completions but {len(traces)} hook traces: "
                           "counting children's tokens needs one trace per completion")
    return [t["usage"]["family_sampled_tokens"] if t else len(ids)
            for t, ids in zip(traces, token_ids)]


def measure(problems, seconds: float, groups: list[list[tuple[int, str]]]) -> dict[str, Any]:
    """One timed run: ``groups`` holds, per problem, (sampled tokens, text)
    of each completion."""
    flat = [(p, text) for p, g in zip(problems, groups) for _, text in g]
    score = task.summarize([p for p, _ in flat], [t for _, t in flat])
    sampled = sum(k for g in groups for k, _ in g)
    sizes = [len(g) for g in groups]
    return {"seconds": seconds, "sampled_tokens": sampled, "tokens_per_s": sampled / seconds,
            "completions": len(flat), "correct": score["correct"],
            "completions_per_prompt": [min(sizes), max(sizes)], "prompts": len(groups)}


# ------------------------------------------------------------------ in-process
def run_native(llm, problems, n: int, logprobs: int | None) -> dict[str, Any]:
    sp = sampling(n, logprobs)
    prompts = [p.prompt for p in problems]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, sp, use_tqdm=False)
    seconds = time.perf_counter() - t0
    groups = []
    for out in outs:
        counts = native_sampled(out.hook_traces, [list(c.token_ids) for c in out.outputs])
        groups.append(list(zip(counts, [c.text for c in out.outputs])))
    row = measure(problems, seconds, groups)
    row["logprobs_as_asked"] = all((c.logprobs is not None) == (logprobs is not None)
                                   for out in outs for c in out.outputs)
    return row


def loop_sampled(res) -> int:
    return res.sampled_tokens + sum(len(c.output_token_ids) for c in res.children)


def run_loop(loop, problems, n: int, logprobs: int | None) -> dict[str, Any]:
    sp = sampling(1, logprobs)
    prompts = [p.prompt for p in problems for _ in range(n)]
    t0 = time.perf_counter()
    results = loop.generate(prompts, sp)
    seconds = time.perf_counter() - t0
    groups = [[(loop_sampled(r), r.text) for r in results[i * n:(i + 1) * n]]
              for i in range(len(problems))]
    return measure(problems, seconds, groups)


def count_check(native, loop, count: int) -> dict[str, Any]:
    """Greedy, n=1, on ``count`` problems: both sides should give the same
    tokens, and where they do, count the same sampled tokens."""
    problems = problems_for(count, 1000)
    sp = sampling(1, None, temperature=0)
    outs = native.generate([p.prompt for p in problems], sp, use_tqdm=False)
    results = loop.generate([p.prompt for p in problems], sp)
    same = [list(o.outputs[0].token_ids) == r.token_ids for o, r in zip(outs, results)]
    nat = [native_sampled([o.hook_trace], [list(o.outputs[0].token_ids)])[0] for o in outs]
    lp = [loop_sampled(r) for r in results]
    return {"families": count, "same_tokens": sum(same),
            "same_count_where_same_tokens": all(a == b for a, b, s in zip(nat, lp, same) if s),
            "native_sampled": sum(nat), "loop_sampled": sum(lp)}


def in_process(size: dict[str, Any], log: Callable[[str], None]) -> dict[str, Any]:
    import vllm

    from vllm_seqhooks import LLM
    from vllm_seqhooks.loops.format_loop import FormatLoop

    model = str(task.model_dir())
    smoke = size.get("smoke", False)  # (timings mean nothing: fewer engines)
    if not smoke:
        close_engine(vllm.LLM(model, **task.ENGINE_KWARGS))  # the first engine runs slower
    settings = json.loads((task.model_dir() / "seqhooks.json").read_text())
    engines = {"native": LLM(model, special_kwargs="auto", **task.ENGINE_KWARGS),
               "loop": vllm.LLM(model, **task.ENGINE_KWARGS)}
    if not smoke:
        engines["native_nofair"] = LLM(model, special_kwargs={**settings, "fair_share": False},
                                       **task.ENGINE_KWARGS)
    configs = CONFIGS if smoke else IN_PROCESS_CONFIGS
    loop = FormatLoop(engines["loop"], engines["native"].special_kwargs)
    check = count_check(engines["native"], loop, size["prompts"] if smoke else 16)
    log(f"  count check: {json.dumps(check)}")
    probes = {name: EngineProbe(llm, log_steps=False) for name, llm in engines.items()}

    def run(config: str, r: int) -> dict[str, Any]:
        problems = problems_for(size["prompts"], r)
        name = config if config == "native_nofair" else config.split("_")[0]
        engines[name].reset_prefix_cache()
        gc.collect()
        probes[name].reset()
        if name == "loop":
            row = run_loop(loop, problems, size["n"], logprobs_of(config))
        else:
            row = run_native(engines[name], problems, size["n"], logprobs_of(config))
        row.update({k: getattr(probes[name].counters, k) for k in COUNTERS})
        log(f"    {config} r{r}: {row['seconds']:.2f} s, {row['tokens_per_s']:.0f} tok/s")
        return row

    runs = interleaved(configs, size["repeats"] + 1, run, log=log)
    for llm in engines.values():
        close_engine(llm)
    return {"count_check": check, **summarize(runs)}


# ------------------------------------------------------------------------ HTTP
class SamplingClient:
    """The OpenAI client as :func:`benchmarks.formats.http_loop_family` (greedy,
    a child's budget what its parent has left) sees it here: every call samples
    at ``TEMPERATURE`` with ``logprobs``, a child at most ``child_max_tokens``
    (as FormatLoop and the engine); counts the tokens each call sampled."""

    def __init__(self, client, logprobs: int | None, child_max_tokens: int | None) -> None:
        self._client = client
        self.logprobs = logprobs
        self.child_max_tokens = child_max_tokens
        self.sampled = 0
        self.completions = self  # client.completions.create(...)

    async def create(self, **kw: Any):
        from vllm_seqhooks.config.request_keys import CHILD_KEY_ARG

        kw["temperature"] = TEMPERATURE
        if self.logprobs is not None:
            kw["logprobs"] = self.logprobs
        if self.child_max_tokens and CHILD_KEY_ARG in kw["extra_body"]["vllm_xargs"]:
            kw["max_tokens"] = min(kw["max_tokens"], self.child_max_tokens)
        r = await self._client.completions.create(**kw)
        self.sampled += len(r.choices[0].token_ids)
        return r


async def http_native_group(client, model: str, prompt: list[int], n: int,
                            logprobs: int | None) -> list[tuple[int, str]]:
    r = await client.completions.create(
        model=model, prompt=prompt, n=n, temperature=TEMPERATURE,
        max_tokens=task.PARENT_MAX_TOKENS, logprobs=logprobs,
        extra_body={"return_token_ids": True})
    choices = sorted(r.choices, key=lambda c: c.index)
    params = (r.model_extra or {}).get("kv_transfer_params") or {}
    traces = params.get("seqhooks_traces")
    if traces is None and params.get("seqhooks") is not None:
        traces = [params["seqhooks"]]  # n = 1, or a frontend without per-completion traces
    counts = native_sampled(traces, [list(c.token_ids) for c in choices])
    return list(zip(counts, [c.text for c in choices]))


def http_run(config: str, ctx: dict[str, Any], problems, n: int) -> dict[str, Any]:
    import requests
    from vllm import SamplingParams

    from benchmarks.formats import _batch, http_loop_family

    native = config.startswith("native")
    url = ctx["native" if native else "stock"].url
    requests.post(url + "/reset_prefix_cache", timeout=30).raise_for_status()
    gc.collect()
    lp, model, tok = logprobs_of(config), ctx["model"], ctx["tokenizer"]
    ids = [tok.encode(p.prompt) for p in problems]
    sp = SamplingParams(max_tokens=task.PARENT_MAX_TOKENS, extra_args={})
    if native:
        async def native_family(client, prompt, _sp):
            return await http_native_group(client, model, prompt, n, lp)
        seconds, groups = asyncio.run(_batch(url, native_family, ids, [sp] * len(ids)))
        return measure(problems, seconds, groups)

    async def loop_family(client, prompt, sp):
        counting = SamplingClient(client, lp, ctx["hooks"].child_max_tokens)
        res = await http_loop_family(counting, model, ctx["hooks"], ctx["codec"], prompt, sp)
        return counting.sampled, tok.decode(res["tokens"], skip_special_tokens=True)

    prompts = [p for p in ids for _ in range(n)]
    seconds, flat = asyncio.run(_batch(url, loop_family, prompts, [sp] * len(prompts)))
    return measure(problems, seconds, [flat[i * n:(i + 1) * n] for i in range(len(ids))])


def start_servers(model: str, workdir: Path) -> tuple[Any, Any]:
    """A native (``--seqhooks auto``) and a stock ``vllm serve``, started at
    once, with the dev endpoint that resets the prefix cache."""
    from vllm_seqhooks.check import trained_engine_flags
    from tests.support.server import start_server

    # Keep-alive beyond a batch: with vLLM's 5 s, a connection idle while its
    # family waits was closed as the client reused it (httpx ReadError).
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "600"}
    flags = trained_engine_flags()
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(start_server, model, *flags, "--seqhooks", "auto",
                               log_path=workdir / "native.log", env=env),
                   pool.submit(start_server, model, *flags, log_path=workdir / "stock.log",
                               env=env)]
    errors = [f.exception() for f in futures]
    if any(errors):
        for f, e in zip(futures, errors):
            if e is None:
                f.result().stop()
        raise next(e for e in errors if e)
    return futures[0].result(), futures[1].result()


def over_http(size: dict[str, Any], workdir: Path, log: Callable[[str], None],
              pending: Any = None) -> dict[str, Any]:
    """``pending``: the servers' start, already under way (a future), else
    they are started here."""
    from transformers import AutoTokenizer

    from vllm_seqhooks.config.presets import coerce_special_kwargs

    model = str(task.model_dir())
    tok = AutoTokenizer.from_pretrained(model)
    t0 = time.perf_counter()
    native, stock = pending.result() if pending is not None else start_servers(model, workdir)
    log(f"  servers up ({time.perf_counter() - t0:.0f} s waited)")
    ctx = {"native": native, "stock": stock, "model": model, "tokenizer": tok,
           "hooks": coerce_special_kwargs("auto", model), "codec": task.text_codec(tok)}
    try:
        def run(config: str, r: int) -> dict[str, Any]:
            row = http_run(config, ctx, problems_for(size["http_prompts"], r), size["n"])
            log(f"    http {config} r{r}: {row['seconds']:.2f} s, "
                f"{row['tokens_per_s']:.0f} tok/s")
            return row

        runs = interleaved(CONFIGS, size["repeats"] + 1, run, log=log)
    finally:
        native.stop()
        stock.stop()
    return summarize(runs)


# ---------------------------------------------------------------- statistics
def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Drops each configuration's first (warm-up) run; per configuration the
    spread of seconds and tokens/s, the reward over all its completions; per
    pair and against the baseline, the spread of the ratios within a repeat."""
    timed = {c: rs[1:] for c, rs in runs.items()}
    configs = {}
    for c, rs in timed.items():
        sizes = [k for r in rs for k in r["completions_per_prompt"]]
        configs[c] = {
            "seconds": spread([r["seconds"] for r in rs]),
            "tokens_per_s": spread([r["tokens_per_s"] for r in rs]),
            "sampled_tokens": spread([r["sampled_tokens"] for r in rs]),
            "reward": sum(r["correct"] for r in rs) / sum(r["completions"] for r in rs),
            "completions_per_prompt": [min(sizes), max(sizes)],
        }
        if "logprobs_as_asked" in rs[0]:
            configs[c]["logprobs_as_asked"] = all(r["logprobs_as_asked"] for r in rs)
        configs[c].update({k: spread([r[k] for r in rs]) for k in COUNTERS if k in rs[0]})

    def ratios(a: str, b: str) -> dict[str, Any]:
        pairs = list(zip(timed[a], timed[b]))
        return {"seconds": spread([x["seconds"] / y["seconds"] for x, y in pairs]),
                "tokens_per_s": spread([x["tokens_per_s"] / y["tokens_per_s"]
                                        for x, y in pairs])}

    return {"configs": configs,
            "vs_baseline": {c: ratios(c, BASELINE) for c in timed if c != BASELINE},
            "pairs": {name: ratios(a, b) for name, (a, b) in PAIRS.items()
                      if a in timed and b in timed},
            "runs": runs}


# ---------------------------------------------------------------------- report
WHAT = {
    "loop": "{loop}, each prompt n times, logprobs=0 (baseline)",
    "loop_b": "the same again (A/A control)",
    "native": "{native} with n, logprobs=0",
    "native_nolp": "native, logprobs off",
    "loop_nolp": "loop, logprobs off",
    "native_nofair": "native, `fair_share: false`, logprobs=0",
}
SIDES = {
    "in_process": {"loop": "FormatLoop over a stock `vllm.LLM`",
                   "native": "`vllm_seqhooks.LLM`, each prompt once"},
    "http": {"loop": "OpenAI-client loop over a stock `vllm serve`",
             "native": "`vllm serve --seqhooks auto`, one request per prompt"},
}


def fmt(s: dict[str, float], digits: int = 3) -> str:
    return fmt_spread(s, digits)


def part_table(part: dict[str, Any], sides: dict[str, str]) -> list[str]:
    lines = ["| configuration | what | wall s | sampled tokens | tokens/s | tokens/s ÷ loop"
             " | wall ÷ loop | reward | completions per prompt |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for c, s in part["configs"].items():
        vs = part["vs_baseline"].get(c)
        lo, hi = s["completions_per_prompt"]
        lines.append(
            f"| `{c}` | {WHAT[c].format(**sides)} | {fmt(s['seconds'], 2)}"
            f" | {s['sampled_tokens']['median']:.0f} | {fmt(s['tokens_per_s'], 0)}"
            f" | {fmt(vs['tokens_per_s']) if vs else '1'} | {fmt(vs['seconds']) if vs else '1'}"
            f" | {s['reward']:.3f} | {lo if lo == hi else f'{lo}–{hi}'} |")
    lines += ["", "| ratio within a repeat | tokens/s | wall time |", "| --- | ---: | ---: |"]
    for name, r in part["pairs"].items():
        lines.append(f"| {name} | {fmt(r['tokens_per_s'])} | {fmt(r['seconds'])} |")
    if "steps" in next(iter(part["configs"].values())):
        lines += ["", "| configuration | prefilled tokens | preemptions | engine steps"
                  " | scheduler s |", "| --- | ---: | ---: | ---: | ---: |"]
        lines += [f"| `{c}` | {s['prefill_tokens']['median']:.0f} | {fmt(s['preemptions'], 0)}"
                  f" | {s['steps']['median']:.0f} | {fmt(s['scheduler_s'], 2)} |"
                  for c, s in part["configs"].items()]
    return lines


def reading(part: dict[str, Any]) -> list[str]:
    """Each ratio against the A/A control's distance from 1."""
    aa = part["pairs"]["A/A control: loop_b / loop"]["tokens_per_s"]
    band = max(aa["max"], 1 / aa["min"])
    out = [f"The A/A control (the same loop twice) spans {aa['min']:.3f}–{aa['max']:.3f} in "
           f"tokens/s: a ratio within {1 / band:.3f}–{band:.3f} is not a difference this run "
           "can show.", ""]
    for name, r in part["pairs"].items():
        if not name.startswith("A/A"):
            t = r["tokens_per_s"]
            where = "inside" if 1 / band <= t["median"] <= band else "outside"
            out.append(f"- {name}: tokens/s ratio {fmt(t)}, median {where} that band.")
    return out


def markdown(results: dict[str, Any]) -> str:
    size, env, argv = results["size"], results["environment"], results["argv"]
    base = " ".join([".venv/bin/python -m benchmarks.rollout", *argv])
    local = [a for i, a in enumerate(argv) if a != "--out" and (i == 0 or argv[i - 1] != "--out")]
    lines = [
        "# RL rollouts: native fork/join vs the ThreadWeaver client loop", "",
        f"`{base}`: {results['duration_s'] / 60:.1f} min on {env['date']}, commit "
        f"`{env['git_commit']}`, vLLM {env['vllm']}, torch {env['torch']} "
        f"({env['torch_threads']} thread), load average at start "
        f"{env['load_average_at_start']}.", "",
        "Measured: GRPO rollout groups from the embedded trained ThreadWeaver-format sorting",
        f"model (`vllm_seqhooks.tasks.threadweaver`): n = {size['n']} samples of each held-out",
        f"problem, temperature {TEMPERATURE}, `max_tokens=PARENT_MAX_TOKENS`; new problems every",
        "repeat, the same for every configuration of a repeat, prefix cache reset before every",
        "run. The model decides where to fork. Wall time: one `generate` (native) or one",
        "`FormatLoop.generate` (its Python work inside); over HTTP, every request of a batch in",
        "flight at once, the client loop's work inside. **Sampled tokens**: every token the",
        "policy sampled, parents' (fork tag included) and children's (end tag included), not the",
        "text inserted at forks and joins: native from each completion's hook trace",
        "(`usage.family_sampled_tokens`), the loop its parents' sampled tokens plus its",
        "children's output tokens (HTTP: every call's completion tokens). **Reward**: the",
        "fraction of completions `task.summarize` counts correct. Configurations interleaved,",
        f"order rotated, one warm-up run of each discarded, timed repeats: {size['repeats']};",
        "medians [min–max]; ratios within a repeat. In-process also `native_nofair` (fair",
        "share off) and engine counters (`benchmarks.common.EngineProbe`; prefilled: prompt",
        "tokens the prefix cache did not serve, merged tokens, recomputation).", "",
    ]
    parts = (("in_process", f"In-process ({size['prompts']} problems × {size['n']})",
              [*local, "--no-http"]),
             ("http", f"Over HTTP ({size['http_prompts']} problems × {size['n']})", local))
    for key, title, part_argv in parts:
        if results.get(key):
            cmd = " ".join([".venv/bin/python -m benchmarks.rollout", *part_argv])
            lines += [f"## {title}", "", f"Reproduce: `{cmd}`", ""]
            lines += part_table(results[key], SIDES[key]) + [""] + reading(results[key]) + [""]
    c = results["in_process"]["count_check"]
    lines += ["## Counting check", "",
              f"Greedy, n=1, {c['families']} problems in-process: {c['same_tokens']} gave the same",
              "tokens on both sides; where they did, the sampled-token counts agree: "
              f"{'yes' if c['same_count_where_same_tokens'] else '**NO**'} (native "
              f"{c['native_sampled']}, loop {c['loop_sampled']} in all).", "",
              "## Machine (`lscpu | head -20`)", "", "```", results["lscpu"].rstrip(), "```", ""]
    return "\n".join(lines)


# ------------------------------------------------------------------------ main
def lscpu() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        return "\n".join(out.splitlines()[:20])
    except (OSError, subprocess.SubprocessError):
        return "(lscpu not available)"


def run_all(size: dict[str, Any], http: bool, smoke: bool) -> dict[str, Any]:
    """In-process, then over HTTP. A smoke run (whose timings mean nothing)
    starts the servers beside the in-process part; a timed run after it."""
    results: dict[str, Any] = {}
    workdir = Path(tempfile.mkdtemp(prefix="seqhooks-rollout-"))
    pool = ThreadPoolExecutor(1)
    pending = pool.submit(start_servers, str(task.model_dir()), workdir) if (
        http and smoke) else None
    try:
        results["in_process"] = in_process(size, print)
        if http:
            results["http"] = over_http(size, workdir, print, pending)
    finally:
        if pending is not None and "http" not in results:
            for server in pending.result():
                server.stop()
        pool.shutdown()
    return results


def main(argv: list[str] | None = None) -> int:
    import sys

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny size, one repeat")
    parser.add_argument("--no-http", action="store_true")
    parser.add_argument("--repeats", type=int, help="timed repeats (after one warm-up), >= 1")
    parser.add_argument("--prompts", type=int, help="problems per in-process run")
    parser.add_argument("--http-prompts", type=int, help="problems per HTTP run")
    parser.add_argument("--out", type=Path,
                        help="directory for rollout.{json,md} (default: print only; "
                             "the published page changes only with --out docs/benchmarks)")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    size = dict(SIZES["smoke" if args.smoke else "default"])
    for key in ("repeats", "prompts", "http_prompts"):
        if getattr(args, key) is not None:
            size[key] = getattr(args, key)
    if size["repeats"] < 1:
        parser.error("--repeats must be at least 1")
    setup_env()
    if args.smoke:
        leave_engines_to_exit()
    t0 = time.perf_counter()
    results: dict[str, Any] = {"size": size, "argv": argv, "environment": environment(argv),
                               "lscpu": lscpu()}
    results["environment"].update(command=" ".join(["python -m benchmarks.rollout", *argv]),
                                  git_commit=git_commit(["vllm_seqhooks", "benchmarks"]))
    results.update(run_all(size, not args.no_http, args.smoke))
    results["duration_s"] = round(time.perf_counter() - t0, 1)
    md = markdown(results)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "rollout.json").write_text(json.dumps(results, indent=2) + "\n")
        (args.out / "rollout.md").write_text(md)
    print(md)
    if args.out:
        print(f"wrote {args.out / 'rollout.md'} and rollout.json")
    n = size["n"]
    ok = all(c["completions_per_prompt"] == [n, n] and c["sampled_tokens"]["min"] > 0
             for part in ("in_process", "http") if results.get(part)
             for c in results[part]["configs"].values())
    if args.smoke:
        exit_leaving_engines(0 if ok else 1)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
