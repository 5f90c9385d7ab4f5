"""Workload 1: what hooks cost when they are not used.

The same batch of plain requests (random prompts, greedy, ``ignore_eos``, a
fixed number of output tokens) through three engines:

* ``stock``: ``vllm.LLM``;
* ``stock_b``: a second, identical ``vllm.LLM`` (an A/A control: its ratio
  to ``stock`` is the resolution of the measurement on this machine);
* ``off``: ``vllm_seqhooks.LLM`` without ``special_kwargs`` (must be vLLM
  itself: goal >= 0.99 of stock);
* ``hooks``: ``vllm_seqhooks.LLM`` with hooks on; the random model never
  samples a hook token (they are suppressed in its weights), so this is the
  per-token scan and per-step bookkeeping alone (goal >= 0.97 of stock).

No scripted-token processor and no counters are installed for the
throughput runs: the engines are exactly what a user gets. Output-token
throughput = batch x max_tokens / wall seconds of ``LLM.generate``; the
ratio is taken within each repeat (the runs of a repeat are adjacent, order
rotated every repeat).

Then, since whole-run throughput on a shared machine moves by several per
cent between identical runs (see ``stock_b``), the part of a step the hook
code can add to is timed directly: the scheduler's ``schedule()`` and
``update_from_output()`` (where all of the hook scheduler's code runs),
wrapped with the same timer in every engine. The difference per step,
divided by the step time, bounds what hooks cost in the engine core.
"""

from __future__ import annotations

import random
import time
from typing import Any

from benchmarks.common import Bench, interleaved, run_generate, spread

CONFIGS = ("stock", "stock_b", "off", "hooks")
KINDS = {"stock": "stock", "stock_b": "stock", "off": "off", "hooks": "hooks"}


def run(bench: Bench) -> dict[str, Any]:
    st = bench.profile.settings["overhead"]
    from vllm import SamplingParams

    kv = st.get("kv_tokens", bench.profile.settings["engines"]["kv_tokens"])
    for name in CONFIGS:
        bench.engine(f"overhead_{name}", KINDS[name], kv_tokens=kv, scripted=False)
    batch, prompt_len, max_tokens = st["batch"], st["prompt_tokens"], st["max_tokens"]
    repeats = st.get("repeats", bench.profile.repeats)
    bench.log(f"  overhead: batch {batch}, prompt {prompt_len}, {max_tokens} output tokens, "
              f"{repeats} repeats")
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    prompts_by_repeat: dict[int, list[list[int]]] = {}
    reference: dict[int, list[list[int]]] = {}

    def one(config: str, r: int) -> dict[str, Any]:
        rng = random.Random(1000 + r)
        prompts = prompts_by_repeat.setdefault(
            r, [[1] + [rng.randrange(9, 104) for _ in range(prompt_len - 1)]
                for _ in range(batch)])
        llm = bench.engines[f"overhead_{config}"]
        llm.reset_prefix_cache()
        cpu0 = time.process_time()
        secs, outs = run_generate(llm, prompts, sp)
        cpu = time.process_time() - cpu0
        toks = [list(o.outputs[0].token_ids) for o in outs]
        same = reference.setdefault(r, toks) == toks
        n = sum(len(t) for t in toks)
        return {"wall_s": secs, "cpu_s": cpu, "output_tokens": n, "tokens_per_s": n / secs,
                "tokens_per_cpu_s": n / cpu,
                "same_tokens_as_first": same}

    # One unmeasured warm-up run per engine (first-call allocations).
    for name in CONFIGS:
        one(name, -1)
    runs = interleaved(list(CONFIGS), repeats, one)
    out: dict[str, Any] = {"settings": dict(st), "configs": {}, "ratios": {}}
    for name, rs in runs.items():
        out["configs"][name] = {
            "tokens_per_s": spread([r["tokens_per_s"] for r in rs]),
            "wall_s": spread([r["wall_s"] for r in rs]),
            "tokens_per_cpu_s": spread([r["tokens_per_cpu_s"] for r in rs]),
            "same_tokens": all(r["same_tokens_as_first"] for r in rs),
            "tokens_per_s_runs": [r["tokens_per_s"] for r in rs],
        }
    for name in ("stock_b", "off", "hooks"):
        ratios = [a["tokens_per_s"] / b["tokens_per_s"]
                  for a, b in zip(runs[name], runs["stock"])]
        out["ratios"][f"{name}/stock"] = spread(ratios)
        out["ratios"][f"{name}/stock cpu"] = spread(
            [a["tokens_per_cpu_s"] / b["tokens_per_cpu_s"]
             for a, b in zip(runs[name], runs["stock"])])
        if name != "stock_b":
            # Against both stock engines (their mean, within the repeat):
            # cancels most of the engine-instance effect the A/A pair shows.
            out["ratios"][f"{name}/stock pair"] = spread(
                [2 * a["tokens_per_s"] / (b["tokens_per_s"] + c["tokens_per_s"])
                 for a, b, c in zip(runs[name], runs["stock"], runs["stock_b"])])
        r = out["ratios"][f"{name}/stock"]
        bench.log(f"    {name}/stock throughput: {r['median']:.3f} "
                  f"[{r['min']:.3f}-{r['max']:.3f}]"
                  + (f", against both stock engines "
                     f"{out['ratios'][f'{name}/stock pair']['median']:.3f}"
                     if name != "stock_b" else ""))
    out["scheduler"] = scheduler_cost(bench, one, st.get("scheduler_repeats", 3))
    return out


def scheduler_cost(bench: Bench, one, repeats: int) -> dict[str, Any]:
    """Seconds per step spent in ``schedule()`` + ``update_from_output()``."""
    from tests.support.observed_calls import observe_calls

    acc: dict[str, dict[str, float]] = {}
    for name in CONFIGS:
        a = acc[name] = {"sched_s": 0.0, "steps": 0}

        def schedule(method, *args, _a=a, **kw):
            t0 = time.perf_counter()
            out = method(*args, **kw)
            _a["sched_s"] += time.perf_counter() - t0
            _a["steps"] += 1 if out.total_num_scheduled_tokens else 0
            return out

        def update(method, *args, _a=a, **kw):
            t0 = time.perf_counter()
            out = method(*args, **kw)
            _a["sched_s"] += time.perf_counter() - t0
            return out

        observe_calls(bench.engines[f"overhead_{name}"], schedule=schedule,
                      update_from_output=update)

    def timed(config: str, r: int) -> dict[str, Any]:
        a = acc[config]
        a["sched_s"], a["steps"] = 0.0, 0
        res = one(config, 100 + r)
        return {"sched_us_per_step": 1e6 * a["sched_s"] / a["steps"],
                "step_ms": 1000 * res["wall_s"] / a["steps"], "steps": a["steps"]}

    runs = interleaved(list(CONFIGS), repeats, timed)
    out: dict[str, Any] = {"repeats": repeats, "configs": {}}
    for name, rs in runs.items():
        out["configs"][name] = {
            "sched_us_per_step": spread([r["sched_us_per_step"] for r in rs]),
            "step_ms": spread([r["step_ms"] for r in rs]),
            "steps": rs[0]["steps"],
        }
    base = out["configs"]["stock"]
    for name in ("stock_b", "off", "hooks"):
        c = out["configs"][name]
        extra_us = c["sched_us_per_step"]["median"] - base["sched_us_per_step"]["median"]
        c["extra_us_per_step"] = extra_us
        c["extra_share_of_step"] = extra_us / (1000 * base["step_ms"]["median"])
        bench.log(f"    {name}: scheduler {c['sched_us_per_step']['median']:.0f} us/step "
                  f"(stock {base['sched_us_per_step']['median']:.0f}), "
                  f"{100 * c['extra_share_of_step']:+.2f}% of a "
                  f"{base['step_ms']['median']:.1f} ms step")
    return out
