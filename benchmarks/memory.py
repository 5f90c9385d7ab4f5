"""Workload 4: KV memory.

``ample``: a batch of fork/join families on the shared engines (KV cache
large enough for every family at once): peak KV blocks in use, and (native)
peak blocks held by parked parents, i.e. parents waiting at ``<sync>``, which
keep their KV cache; the loop's parents free theirs when they stop (their
full blocks stay in the prefix cache as evictable entries).

``tight``: the same batch on two more engines (native and stock) whose KV
cache holds only ``tight_fraction`` of the native peak: vLLM preempts
(recomputes) running requests, evicts cached blocks, and the native engine
spills parked parents when nothing else can run. Reported: wall time,
throughput, tokens computed (recomputation included), preemptions, spills.
"""

from __future__ import annotations

from typing import Any

from benchmarks.common import Bench, interleaved, spread
from benchmarks.forkjoin import engines, families, run_one, warm_up


def _summ(runs: dict[str, list[dict]], blocks: dict[str, int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, rs in runs.items():
        out[name] = {
            "wall_s": spread([r["wall_s"] for r in rs]),
            "cpu_s": spread([r["cpu_s"] for r in rs]),
            "tokens_per_s": spread([r["tokens_per_s"] for r in rs]),
            "computed_tokens": spread([r["computed_tokens"] for r in rs]),
            "prefill_tokens": spread([r["prefill_tokens"] for r in rs]),
            "steps": spread([r["steps"] for r in rs]),
            "peak_blocks_in_use": max(r["peak_blocks_in_use"] for r in rs),
            "peak_parked_blocks": max(r["peak_parked_blocks"] for r in rs),
            "preemptions": spread([r["preemptions"] for r in rs]),
            "spills": spread([r.get("spills", 0) for r in rs]),
            "kv_blocks": blocks[name],
            "correct": all(r["correct"] for r in rs),
        }
    if "native" in runs and "loop" in runs:
        out["native/loop"] = {
            key: spread([a[key] / b[key] for a, b in zip(runs["native"], runs["loop"])])
            for key in ("wall_s", "cpu_s", "computed_tokens", "prefill_tokens")
        }
    return out


def run(bench: Bench) -> dict[str, Any]:
    st = bench.profile.settings["memory"]
    point = dict(st["point"])
    configs = list(st.get("configs", ("native", "loop")))
    repeats = st.get("repeats", bench.profile.repeats)
    engines(bench)
    sep = list(bench.engines["native"].special_kwargs.merge_separator_token_ids or ())
    fams_by_repeat: dict[int, Any] = {}

    def fams(r: int):
        return fams_by_repeat.setdefault(r, families(point, 200 + r, sep))

    bench.log(f"  memory (ample KV) context={point['context']} k={point['k']} "
              f"batch={point['batch']} m={point['child_tokens']}")
    ample_blocks = {"native": bench.probes["native"].num_blocks,
                    "loop": bench.probes["stock_scripted"].num_blocks,
                    "eager": bench.probes["stock_scripted"].num_blocks}
    ample = interleaved(configs, repeats, lambda c, r: run_one(bench, c, fams(r)))
    ample_s = _summ(ample, ample_blocks)
    peak = ample_s["native"]["peak_blocks_in_use"]
    block = bench.profile.block_size
    fam = fams(0)[0]
    longest = len(fam.prompt) + len(fam.expected_output) + 1
    max_len = -(-longest // 256) * 256
    tight_blocks = max(int(peak * st["tight_fraction"]), -(-max_len // block) + 2)
    bench.log(f"    ample: native peak {peak} blocks in use, "
              f"{ample_s['native']['peak_parked_blocks']} parked; loop peak "
              f"{ample_s['loop']['peak_blocks_in_use']}; tight KV = {tight_blocks} blocks")
    kv_tokens = (tight_blocks + 1) * block
    bench.engine("native_tight", "hooks", kv_tokens=kv_tokens, scripted=True,
                 max_model_len=max_len)
    bench.engine("stock_tight", "stock", kv_tokens=kv_tokens, scripted=True,
                 max_model_len=max_len)
    bench.probe("native_tight", track_parked=True)
    bench.probe("stock_tight")
    warm_up(bench, ("native_tight", "stock_tight"))
    tight_blocks_actual = {"native": bench.probes["native_tight"].num_blocks,
                           "loop": bench.probes["stock_tight"].num_blocks,
                           "eager": bench.probes["stock_tight"].num_blocks}
    bench.log(f"  memory (tight KV: {tight_blocks_actual['native']} blocks)")
    tight = interleaved(configs, repeats, lambda c, r: run_one(
        bench, c, fams(r), engine_names=("native_tight", "stock_tight")))
    tight_s = _summ(tight, tight_blocks_actual)
    for name in configs:
        t = tight_s[name]
        bench.log(f"    tight {name}: {t['wall_s']['median']:.2f} s, computed "
                  f"{t['computed_tokens']['median']:.0f} tokens, preemptions "
                  f"{t['preemptions']['median']:.0f}, spills {t['spills']['median']:.0f}, "
                  f"peak {t['peak_blocks_in_use']} blocks ({t['peak_parked_blocks']} parked)")
    return {"point": point, "block_size": block, "ample": ample_s, "tight": tight_s,
            "tight_fraction": st["tight_fraction"], "max_model_len_tight": max_len}
