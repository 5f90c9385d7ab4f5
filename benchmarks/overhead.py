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

No scripted-token processor and no counters are installed here: the engines
are exactly what a user gets. Output-token throughput = batch x max_tokens /
wall seconds of ``LLM.generate``; the ratio is taken within each repeat
(the three runs of a repeat are adjacent, order rotated every repeat).
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
        }
    for name in ("stock_b", "off", "hooks"):
        ratios = [a["tokens_per_s"] / b["tokens_per_s"]
                  for a, b in zip(runs[name], runs["stock"])]
        out["ratios"][f"{name}/stock"] = spread(ratios)
        out["ratios"][f"{name}/stock cpu"] = spread(
            [a["tokens_per_cpu_s"] / b["tokens_per_cpu_s"]
             for a, b in zip(runs[name], runs["stock"])])
        r = out["ratios"][f"{name}/stock"]
        bench.log(f"    {name}/stock throughput: {r['median']:.3f} "
                  f"[{r['min']:.3f}-{r['max']:.3f}]")
    return out
