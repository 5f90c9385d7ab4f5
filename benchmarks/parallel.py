"""Workload 3: the same child tokens, forked in parallel or written by one
sequential request.

``forked``: a fork/join family through the native engine (``k`` children of
``child_tokens`` tokens). ``sequential``: one request on the same engine that
writes, for each child, its payload then its output and the merge separator,
then the parent's continuation: the same tokens, minus the hook tokens.

The ideal speed-up is the critical-path ratio: decode steps the sequential
request needs over those the forked family needs when every child starts
right after its ``</promise>`` (:func:`benchmarks.common.critical_path_tokens`).
The measured one is the wall-clock ratio; the engine-step ratio sits between.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.common import Bench, family_params, interleaved, spread
from benchmarks.forkjoin import engines, families, run_native, sampled_tokens
from vllm_seqhooks.scripted.tiny_model import EOS_ID

CONFIGS = ("forked", "sequential")


def run(bench: Bench) -> dict[str, Any]:
    st = bench.profile.settings["parallel"]
    engines(bench)
    llm = bench.engines["native"]
    probe = bench.probes["native"]
    sep = list(llm.special_kwargs.merge_separator_token_ids or ())
    points = []
    for spec in st["points"]:
        point = {**st["shape"], **spec}
        repeats = spec.get("repeats", bench.profile.repeats)
        bench.log(f"  parallel context={point['context']} k={point['k']} "
                  f"batch={point['batch']} m={point['child_tokens']} ({repeats} repeats)")
        fams_by_repeat: dict[int, Any] = {}

        def one(config: str, r: int) -> dict[str, Any]:
            fams = fams_by_repeat.setdefault(r, families(point, 100 + r, sep))
            seq = config == "sequential"
            params = [family_params(f, sequential=seq) for f in fams]
            llm.reset_prefix_cache()
            probe.reset()
            cpu0 = time.process_time()
            secs, outs, _ = run_native(llm, [f.prompt for f in fams], params,
                                       timeout_s=bench.timeout_s)
            cpu = time.process_time() - cpu0
            c = probe.take()
            if seq:
                ok = all(list(o.outputs[0].token_ids) == f.sequential_script + [EOS_ID]
                         for o, f in zip(outs, fams))
            else:
                ok = all(list(o.outputs[0].token_ids) == f.expected_output
                         for o, f in zip(outs, fams))
            return {"wall_s": secs, "cpu_s": cpu, "steps": c.steps, "computed_tokens": c.computed_tokens,
                    "correct": ok}

        runs = interleaved(list(CONFIGS), repeats, one)
        fam = fams_by_repeat[0][0]
        from benchmarks.common import critical_path_tokens

        forked_cp, seq_cp = critical_path_tokens(fam)
        wall = [s["wall_s"] / f["wall_s"] for s, f in zip(runs["sequential"], runs["forked"])]
        steps = [s["steps"] / f["steps"] for s, f in zip(runs["sequential"], runs["forked"])]
        cpu = [s["cpu_s"] / f["cpu_s"] for s, f in zip(runs["sequential"], runs["forked"])]
        out = {
            **point,
            "critical_path": {"forked": forked_cp, "sequential": seq_cp,
                              "ratio": seq_cp / forked_cp},
            "speedup_wall": spread(wall),
            "speedup_steps": spread(steps),
            "speedup_cpu": spread(cpu),
            "efficiency": spread([w / (seq_cp / forked_cp) for w in wall]),
            "forked_wall_s": spread([r["wall_s"] for r in runs["forked"]]),
            "sequential_wall_s": spread([r["wall_s"] for r in runs["sequential"]]),
            "forked_steps": spread([r["steps"] for r in runs["forked"]]),
            "sequential_steps": spread([r["steps"] for r in runs["sequential"]]),
            "forked_computed_tokens": runs["forked"][0]["computed_tokens"],
            "sequential_computed_tokens": runs["sequential"][0]["computed_tokens"],
            "sampled_tokens_forked": sampled_tokens(fams_by_repeat[0]),
            "correct": all(r["correct"] for rs in runs.values() for r in rs),
        }
        bench.log(f"    speed-up wall {out['speedup_wall']['median']:.2f}x "
                  f"[{out['speedup_wall']['min']:.2f}-{out['speedup_wall']['max']:.2f}], "
                  f"steps {out['speedup_steps']['median']:.2f}x, critical path "
                  f"{out['critical_path']['ratio']:.2f}x")
        points.append(out)
    return {"shape": st["shape"], "points": points}
