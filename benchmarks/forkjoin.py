"""Workload 2: fork/join, native hooks against client-side loops over stock
vLLM.

Each family: a parent with a ``context``-token prompt writes ``k`` promises
(``<promise>`` + ``payload`` tokens + ``</promise>``), then ``<sync>``, then
``continuation`` tokens and EOS; each child writes ``child_tokens`` tokens and
EOS. ``batch`` families run at once. Every token is forced by the scripted
logits processor, so all configurations compute the same tokens (checked
on every run).

Configurations (engines are created once and reused for the whole grid):

* ``native``: ``vllm_seqhooks.LLM`` with hooks;
* ``loop``: the project's client loop over stock ``vllm.LLM``
  (:class:`vllm_seqhooks.loops.promise_loop.ClientLoop`, ``mode="events"``):
  every request sent the moment the client knows it, children when the
  parent stops at ``<sync>``;
* ``eager``: the same client streaming the parent's output, each child sent
  as soon as its payload closes (``mode="stream"``);
* ``lockstep``: the same client, one blocking ``generate`` per round
  (``mode="lockstep"``);
* ``arrival``: ``native`` with vLLM's own batch order.

Both engines have prefix caching on, the same block size, batch limits and KV
cache size; the prefix cache is reset before every run. Counters come from
:class:`benchmarks.common.EngineProbe` on each engine. Native runs go through
the same engine step loop as the client's
(:func:`vllm_seqhooks.loops.stepping.drive`, the loop ``LLM.generate``
runs) and the same ``add_request`` path.
"""

from __future__ import annotations

import itertools
import random
import time
from typing import Any, Sequence

from benchmarks.common import (
    Bench,
    critical_path_tokens,
    family_params,
    fit_step_cost,
    hook_settings,
    interleaved,
    make_family,
    median,
    spread,
)
from vllm_seqhooks.loops.promise_loop import ClientLoop
from vllm_seqhooks.loops.stepping import drive

CONFIGS = ("native", "loop", "eager", "lockstep", "arrival")
#: The client loop's mode of each loop configuration.
LOOP_MODES = {"loop": "events", "eager": "stream", "lockstep": "lockstep"}

_native_runs = itertools.count()


def engines(bench: Bench) -> tuple[Any, Any]:
    """The native (hooks) and stock engines, both with the scripted-token
    logits processor; shared by the fork/join, parallel and memory workloads."""
    kv = bench.profile.settings["engines"]["kv_tokens"]
    native = bench.engine("native", "hooks", kv_tokens=kv, scripted=True)
    stock = bench.engine("stock_scripted", "stock", kv_tokens=kv, scripted=True)
    bench.probe("native", track_parked=True)
    bench.probe("stock_scripted")
    warm_up(bench, ("native", "stock_scripted"))
    return native, stock


def arrival_engine(bench: Bench) -> None:
    """``native_arrival``: native hooks with vLLM's own batch order (no
    family grouping), after one unmeasured run."""
    if "native_arrival" in bench.engines:
        return
    bench.engine("native_arrival", "hooks-arrival",
                 kv_tokens=bench.profile.settings["engines"]["kv_tokens"], scripted=True)
    bench.probe("native_arrival", track_parked=True)
    sep = list(bench.engines["native_arrival"].special_kwargs.merge_separator_token_ids or ())
    run_one(bench, "arrival", families(WARM_UP, -1, sep))  # warm-up, unmeasured


WARM_UP = dict(context=96, k=2, batch=2, payload=2, continuation=4, child_tokens=8)


def warm_up(bench: Bench, engine_names: tuple[str, str]) -> None:
    """One unmeasured fork/join run per engine (first calls allocate)."""
    done = bench.__dict__.setdefault("_warmed", set())
    if engine_names in done:
        return
    done.add(engine_names)
    sep = list(bench.engines[engine_names[0]].special_kwargs.merge_separator_token_ids or ())
    fams = families(WARM_UP, -1, sep)
    for config in ("native", "loop"):
        run_one(bench, config, fams, engine_names=engine_names)


def families(point: dict[str, Any], repeat: int, separator: list[int]):
    seed = hash((point["context"], point["k"], point["batch"], point["child_tokens"],
                 point.get("think", 0), repeat))
    rng = random.Random(seed & 0xFFFFFFFF)
    return [make_family(rng, context=point["context"], k=point["k"],
                        child_tokens=point["child_tokens"], payload=point["payload"],
                        continuation=point["continuation"], separator=separator,
                        think=point.get("think", 0))
            for _ in range(point["batch"])]


def sampled_tokens(fams) -> int:
    """Tokens the model samples for these families (parents + children, EOS
    included): the same for every configuration."""
    return sum(len(f.parent_script) + 1 + sum(len(c) + 1 for c in f.children.values())
               for f in fams)


def run_native(llm: Any, prompts: Sequence[Sequence[int]], params: Sequence[Any], *,
               timeout_s: float | None = None) -> tuple[float, list[Any], list[float]]:
    """Parents through the native engine, stepped like the client loop's
    (:func:`~vllm_seqhooks.loops.stepping.drive`): (seconds, final
    outputs in prompt order, each one's finish time in seconds)."""
    from vllm.sampling_params import RequestOutputKind

    tag = next(_native_runs)
    finals: dict[str, Any] = {}
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    reqs = []
    for i, (p, sp) in enumerate(zip(prompts, params)):
        sp = sp.clone()
        sp.output_kind = RequestOutputKind.FINAL_ONLY
        reqs.append((f"n{tag}-{i}", p, sp))

    def on_output(out: Any):
        if out.finished:
            finals[out.request_id] = out
            times[out.request_id] = time.perf_counter() - t0
        return ()

    secs = drive(llm, reqs, on_output, timeout_s)
    return secs, [finals[rid] for rid, _, _ in reqs], [times[rid] for rid, _, _ in reqs]


def run_one(bench: Bench, config: str, fams, *, engine_names=("native", "stock_scripted")
            ) -> dict[str, Any]:
    """One run of ``fams`` through ``config``; returns its measurements."""
    native_name, stock_name = engine_names
    name = {"native": native_name, "arrival": "native_arrival"}.get(config, stock_name)
    llm = bench.engines[name]
    probe = bench.probes[name]
    prompts = [f.prompt for f in fams]
    params = [family_params(f) for f in fams]
    llm.reset_prefix_cache()
    probe.reset()
    cpu0 = time.process_time()
    join_prefill: int | None = None
    extra: dict[str, Any] = {}
    if config in ("native", "arrival"):
        sched = probe.sched
        before = sched.hook_stats
        secs, outs, finish = run_native(llm, prompts, params, timeout_s=bench.timeout_s)
        after = sched.hook_stats
        tokens = [list(o.outputs[0].token_ids) for o in outs]
        join_prefill = after["join_prefill_tokens"] - before["join_prefill_tokens"]
        extra = {k: after[k] - before[k] for k in
                 ("children_spawned", "joins", "spills", "preemptions", "fork_cached_tokens",
                  "join_reused_tokens")}
    elif config in LOOP_MODES:
        loop = ClientLoop(llm, hook_settings(), mode=LOOP_MODES[config],
                          timeout_s=bench.timeout_s)
        outs = loop.generate([{"prompt_token_ids": list(p)} for p in prompts], params)
        secs = loop.stats["seconds"]
        tokens = [o.token_ids for o in outs]
        finish = [o.finish_time for o in outs]
        join_prefill = sum(o.join_prefill_tokens for o in outs)
        extra = {"rounds": sum(o.rounds for o in outs),
                 "cached_tokens": sum(o.cached_tokens for o in outs)}
    else:
        raise ValueError(config)
    cpu = time.process_time() - cpu0
    c = probe.take()
    correct = all(t == f.expected_output for t, f in zip(tokens, fams))
    n = sampled_tokens(fams)
    return {
        "wall_s": secs,
        "cpu_s": cpu,
        "mean_latency_s": sum(finish) / len(finish),
        "sampled_tokens": n,
        "tokens_per_s": n / secs,
        "correct": correct,
        "join_prefill_tokens": join_prefill,
        **c.as_dict(),
        "step_log": c.step_log,
        **extra,
    }


def _ratio(runs: dict[str, list[dict]], a: str, b: str, key: str) -> list[float]:
    out = []
    for x, y in zip(runs[a], runs[b]):
        if x.get(key) is None or not y.get(key):
            continue
        out.append(x[key] / y[key])
    return out


def summarize(point: dict[str, Any], runs: dict[str, list[dict]], fam) -> dict[str, Any]:
    configs: dict[str, Any] = {}
    for name, rs in runs.items():
        configs[name] = {
            "wall_s": spread([r["wall_s"] for r in rs]),
            "cpu_s": spread([r["cpu_s"] for r in rs]),
            "mean_latency_s": median([r["mean_latency_s"] for r in rs]),
            "tokens_per_s": spread([r["tokens_per_s"] for r in rs]),
            "steps": median([r["steps"] for r in rs]),
            "prefill_tokens": median([r["prefill_tokens"] for r in rs]),
            "decode_tokens": median([r["decode_tokens"] for r in rs]),
            "computed_tokens": median([r["computed_tokens"] for r in rs]),
            "join_prefill_tokens": (median([r["join_prefill_tokens"] for r in rs])
                                    if rs[0]["join_prefill_tokens"] is not None else None),
            "peak_blocks_in_use": max(r["peak_blocks_in_use"] for r in rs),
            "peak_parked_blocks": max(r["peak_parked_blocks"] for r in rs),
            "preemptions": max(r["preemptions"] for r in rs),
            "correct": all(r["correct"] for r in rs),
            "step_cost": fit_step_cost([r["step_log"] for r in rs]),
            "tokens_per_step": median([r["computed_tokens"] / r["steps"] for r in rs]),
        }
        for key in ("rounds", "spills", "children_spawned", "joins", "cached_tokens",
                    "fork_cached_tokens"):
            if key in rs[0]:
                configs[name][key] = median([r[key] for r in rs])
    ratios: dict[str, Any] = {}
    for other in runs:
        if other == "native":
            continue
        ratios[f"native/{other}"] = {
            key: spread(_ratio(runs, "native", other, key))
            for key in ("wall_s", "cpu_s", "mean_latency_s", "prefill_tokens", "computed_tokens",
                        "steps", "join_prefill_tokens")
        }
    forked, sequential = critical_path_tokens(fam)
    return {**point, "configs": configs, "ratios": ratios,
            "critical_path_tokens": forked, "sequential_tokens": sequential}


def run(bench: Bench) -> dict[str, Any]:
    st = bench.profile.settings["forkjoin"]
    engines(bench)
    sep = list(bench.engines["native"].special_kwargs.merge_separator_token_ids or ())
    points_out = []
    for spec in st["points"]:
        point = {**st["shape"], **spec}
        configs = [c for c in spec.get("configs", st["configs"])]
        if "arrival" in configs:
            arrival_engine(bench)
        repeats = spec.get("repeats", bench.profile.repeats)
        bench.log(f"  forkjoin context={point['context']} k={point['k']} "
                  f"batch={point['batch']} m={point['child_tokens']} "
                  f"think={point.get('think', 0)} ({', '.join(configs)}, "
                  f"{repeats} repeats)")
        fams_by_repeat: dict[int, Any] = {}

        def one(config: str, r: int):
            fams = fams_by_repeat.setdefault(r, families(point, r, sep))
            return run_one(bench, config, fams)

        runs = interleaved(configs, repeats, one)
        summary = summarize(point, runs, fams_by_repeat[0][0])
        for name, c in summary["configs"].items():
            if not c["correct"]:
                bench.log(f"    WARNING: {name} produced unexpected tokens")
        for key, r in summary["ratios"].items():
            bench.log(f"    {key}: wall {r['wall_s']['median']:.3f} "
                      f"[{r['wall_s']['min']:.3f}-{r['wall_s']['max']:.3f}], prefill "
                      f"{r['prefill_tokens']['median']:.4f}, steps {r['steps']['median']:.3f}")
        points_out.append(summary)
    return {"shape": st["shape"], "points": points_out}
