"""Splice joins against re-prefill joins and the format's client loop
(issue 21, item 6).

    python -m benchmarks.splice --out docs/benchmarks     # the published run
    python -m benchmarks.splice --smoke                   # a quick check

A batch of Multiverse-format families with scripted tokens
(:mod:`tests.support.format_scripts`: a prompt of ``context``
tokens, an outline of ``k`` items, children of ``child_tokens`` tokens
ending at ``</Path>``, a continuation after the join), run three ways in
one process, interleaved, order rotated:

* ``splice``: ``vllm_seqhooks.LLM(special_kwargs="multiverse")`` (the
  preset joins by splice);
* ``reprefill``: the same with ``join="reprefill"``;
* ``loop``: :class:`~vllm_seqhooks.loops.format_loop.FormatLoop` over a
  stock ``vllm.LLM`` (stop at the fork tag, run the children, re-submit the
  parent with the merged text);
* ``splice-aa``: ``splice`` again, on the same engine and a batch of the
  same shape with other prompts (the A/A control: its time ratio to
  ``splice`` is the noise; same prompts would find them in the prefix cache).

Two workloads: ``forkjoin`` (KV cache for every family at once) and
``kv_pressure`` (KV cache for a fraction of them). Every engine is probed
the same way (:class:`benchmarks.common.EngineProbe`): tokens computed (the
step's scheduled tokens, summed), of them prefill (everything but each
generating request's newest token), largest number of KV blocks held,
preemptions. Per family the minimum is its prompt plus its output (each
token's KV computed once). Paths share positions, so every path's start
(the fork tag's last token and the lead before its header) has the same
KV: a splice engine whose later children find the first one's start in
the prefix cache computes a little below this minimum. Join prefill: the native traces'
``prefilled_tokens`` of each join; for the loop, the parent's prompt tokens
not served by the prefix cache in its second round (its first round's
prompt is fresh, so all of it is counted as computed).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

#: "splice-aa" runs the splice engine again: the A/A control of the timings.
CONFIGS = ("splice", "reprefill", "loop", "splice-aa")
SIZES = {
    "smoke": dict(batch=2, context=64, k=2, child_tokens=12, continuation=8, repeats=1,
                  tight_fraction=0.5),
    "default": dict(batch=16, context=512, k=4, child_tokens=96, continuation=32,
                    repeats=5, tight_fraction=0.35),
}
BLOCK_SIZE = 32


def spec(join: str) -> dict[str, Any]:
    return {"format": "multiverse", "join": join, "max_child_depth": 1,
            "fork_min_tokens": None}


def workload(size: dict[str, Any], S, seed: int):
    from tests.support.format_scripts import format_script

    rng = random.Random(f"splice:{seed}")
    prompts, params = [], []
    for _ in range(size["batch"]):
        prompts.append(S("".join(rng.choice("abcdefghij ") for _ in range(size["context"]))))
        fs = format_script("multiverse", rng, k=size["k"], child_tokens=size["child_tokens"],
                           continuation=size["continuation"])
        params.append(S.params(fs.before + fs.after, fs.children,
                               max_tokens=family_tokens(size) - size["context"]))
    return prompts, params


def family_tokens(size: dict[str, Any]) -> int:
    """An upper bound of one family's tokens (prompt, paths, continuation),
    in whole blocks: the engines' max_model_len."""
    tokens = size["context"] + size["k"] * (size["child_tokens"] + 40) + size["continuation"] + 200
    return -(-tokens // BLOCK_SIZE) * BLOCK_SIZE


def engines(model: str, kv_tokens: int, max_model_len: int):
    import vllm

    from benchmarks.common import EngineProbe, kv_bytes_per_token
    from vllm_seqhooks.llm import LLM
    from tests.support.forkjoin import scripted_engine_kwargs

    kwargs = scripted_engine_kwargs(
        model, block_size=BLOCK_SIZE, max_model_len=max_model_len, enable_prefix_caching=True,
        kv_cache_memory_bytes=kv_tokens * kv_bytes_per_token(Path(model), "float32"))
    made = {"loop": vllm.LLM(model, **kwargs)}
    for join in ("splice", "reprefill"):
        made[join] = LLM(model, special_kwargs=spec(join), **kwargs)
    return made, {name: EngineProbe(llm, log_steps=False) for name, llm in made.items()}


def run_one(config: str, llm, probe, prompts, params) -> dict[str, Any]:
    from vllm_seqhooks import get_hook_trace
    from vllm_seqhooks.loops.format_loop import FormatLoop

    probe.reset()
    t0 = time.perf_counter()
    if config == "loop":
        results = FormatLoop(llm, spec("reprefill")).generate(
            [{"prompt_token_ids": p} for p in prompts], params)
        seconds = time.perf_counter() - t0
        outputs = [r.token_ids for r in results]
        join_prefill = sum(r.parent_prefilled_tokens - len(p) for r, p in zip(results, prompts))
        fallbacks = 0
    else:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        seconds = time.perf_counter() - t0
        outputs = [list(o.outputs[0].token_ids) for o in outs]
        traces = [get_hook_trace(o) for o in outs]
        join_prefill = sum(j["prefilled_tokens"] or 0 for t in traces for j in t["joins"])
        join = "reprefill" if config == "reprefill" else "splice"
        fallbacks = sum(j["mode"] != join for t in traces for j in t["joins"])
    c = probe.take()
    minimum = sum(len(p) + len(o) for p, o in zip(prompts, outputs))
    return {"seconds": seconds, "computed_tokens": c.computed_tokens,
            "prefill_tokens": c.prefill_tokens, "minimum_tokens": minimum,
            "join_prefill_tokens": join_prefill, "peak_blocks": c.peak_blocks_in_use,
            "preemptions": c.preemptions, "fallbacks": fallbacks, "outputs": outputs}


def run_workload(name: str, model: str, size: dict[str, Any], kv_tokens: int) -> dict[str, Any]:
    from benchmarks.common import close_engine, interleaved
    from tests.support.forkjoin import Scripts

    made, probes = engines(model, kv_tokens, family_tokens(size))
    made["splice-aa"], probes["splice-aa"] = made["splice"], probes["splice"]
    S = Scripts(made["loop"].get_tokenizer())
    warm = workload(SIZES["smoke"], S, seed=999)
    for config in CONFIGS:
        run_one(config, made[config], probes[config], *warm)
    batches = {config: [workload(size, S, seed=1000 + r if config == "splice-aa" else r)
                        for r in range(size["repeats"])] for config in CONFIGS}
    results = interleaved(CONFIGS, size["repeats"],
                          lambda config, r: run_one(config, made[config], probes[config],
                                                    *batches[config][r]),
                          log=lambda m: print(f"  {name}: {m}", flush=True))
    same = all(results["splice"][r]["outputs"] == results[c][r]["outputs"]
               for c in ("reprefill", "loop") for r in range(size["repeats"]))
    for config in ("splice", "reprefill", "loop"):
        close_engine(made[config])
    row: dict[str, Any] = {"workload": name, "kv_tokens": kv_tokens, "same_tokens": same}
    for config in CONFIGS:
        rs = results[config]
        med = lambda key: statistics.median(r[key] for r in rs)  # noqa: E731
        row[config] = {
            "seconds": round(med("seconds"), 3),
            "computed_tokens": int(med("computed_tokens")),
            "prefill_tokens": int(med("prefill_tokens")),
            "minimum_tokens": int(med("minimum_tokens")),
            "computed_over_minimum": round(med("computed_tokens") / med("minimum_tokens"), 3),
            "join_prefill_tokens": int(med("join_prefill_tokens")),
            "peak_blocks": int(med("peak_blocks")),
            "preemptions": int(med("preemptions")),
            "splice_fallbacks": int(med("fallbacks")),
        }
    for config in ("reprefill", "loop", "splice-aa"):
        ratios = [s["seconds"] / o["seconds"] for s, o in zip(results["splice"], results[config])]
        row[f"latency_splice_over_{config}"] = {
            "median": round(statistics.median(ratios), 3),
            "range": [round(min(ratios), 3), round(max(ratios), 3)]}
    return row


def markdown(rows: list[dict[str, Any]], size: dict[str, Any], env: dict[str, Any]) -> str:
    lines = [
        "# Splice joins vs re-prefill joins vs the format's client loop",
        "",
        "Reproduce: `python -m benchmarks.splice --out docs/benchmarks` "
        f"(commit {env.get('git_commit', '?')}, {env.get('cpu', '?')}, {env.get('torch_threads', '?')} torch thread).",
        "",
        f"Multiverse format, tiny model (float32, CPU), block size {BLOCK_SIZE}, prefix "
        f"caching on; {size['batch']} families per batch, prompts of {size['context']} "
        f"tokens, {size['k']} paths of {size['child_tokens']} tokens, "
        f"{size['continuation']} tokens after the join; median of {size['repeats']} "
        "interleaved repeats (order rotated). Tokens: per batch, summed over the "
        "engine's steps; minimum = prompt + output of every family.",
        "",
        "| workload | join | computed | / minimum | prefill | join prefill | peak KV blocks "
        "| preemptions | splice joins done by re-prefill | seconds |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        for config in CONFIGS:
            r = row[config]
            lines.append(
                f"| {row['workload']} ({row['kv_tokens']} KV tokens) | {config} "
                f"| {r['computed_tokens']} | {r['computed_over_minimum']} "
                f"| {r['prefill_tokens']} | {r['join_prefill_tokens']} | {r['peak_blocks']} "
                f"| {r['preemptions']} "
                f"| {r['splice_fallbacks'] if config == 'splice' else ''} | {r['seconds']} |")
    lines += ["", "Seconds per batch, splice over each other configuration: median "
              "(min-max) of the per-repeat ratios; splice-aa is the A/A control.", "",
              "| workload | / re-prefill | / loop | / splice-aa (A/A) | same tokens |",
              "| --- | ---: | ---: | ---: | --- |"]
    for row in rows:
        cells = []
        for config in ("reprefill", "loop", "splice-aa"):
            r = row[f"latency_splice_over_{config}"]
            cells.append(f"{r['median']} ({r['range'][0]}-{r['range'][1]})")
        lines.append(f"| {row['workload']} | {' | '.join(cells)} | {row['same_tokens']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from benchmarks.common import (bench_model, environment, exit_leaving_engines,
                                   leave_engines_to_exit, setup_env)

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", type=Path, default=None,
                    help="directory for splice.{json,md} (default: print only; "
                         "the published page changes only with --out docs/benchmarks)")
    ap.add_argument("--cache-dir", type=Path, default=None, help="where the model is built")
    args = ap.parse_args(argv)
    setup_env()
    if args.smoke:
        leave_engines_to_exit()
    size = SIZES["smoke" if args.smoke else "default"]
    model = str(bench_model("tiny", "float32", args.cache_dir))
    ample = family_tokens(size) * size["batch"] * 2
    tight = max(family_tokens(size) + 4 * BLOCK_SIZE,
                int(family_tokens(size) * size["batch"] * size["tight_fraction"]))
    rows = []
    for name, kv_tokens in (("forkjoin", ample), ("kv_pressure", tight)):
        rows.append(run_workload(name, model, size, kv_tokens))
        print(json.dumps(rows[-1]), flush=True)
    env = environment(argv)
    text = markdown(rows, size, env)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "splice.json").write_text(
            json.dumps({"size": size, "rows": rows, "environment": env}, indent=2) + "\n")
        (args.out / "splice.md").write_text(text)
        print(f"wrote {args.out / 'splice.md'} and splice.json")
    code = 0 if all(row["same_tokens"] for row in rows) else 1
    if args.smoke:
        exit_leaving_engines(code)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
