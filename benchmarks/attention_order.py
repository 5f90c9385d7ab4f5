"""Does the order of requests in the batch change the cost of attention?

Runs one fork/join batch (16 families x 4 children, 1,024-token contexts, the
``--full`` model) through native hooks with vLLM's batch order
(``batch_order="arrival"``) and through the client loop over stock vLLM,
captures the inputs of the CPU attention call of one layer at a decode step of
the children's phase, and replays that call alone with its rows in several
orders: as captured, grouped by family (rows sharing their first KV block),
interleaved round-robin across families, and shuffled. Same inputs, same
kernel, same KV cache: only the order of the rows changes.

    .venv/bin/python -m benchmarks.attention_order [--out docs/benchmarks]

Writes ``attention_order.md`` and ``attention_order.json`` into ``--out``
(default: a user cache, ``${XDG_CACHE_HOME:-~/.cache}/vllm-seqhooks/benchmarks``;
the published page changes only with ``--out docs/benchmarks``). CPU backend
only: it wraps ``vllm._custom_ops.cpu_attention_with_kv_cache``.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

from benchmarks.common import default_out_dir, setup_env

CAPTURE_STEPS = (50, 60)  # decode steps in the children's phase (of ~110)
ORDERS = ("as captured", "grouped by family", "round-robin", "shuffled")


class Capture:
    """Wraps the CPU attention ops; keeps the first call of a chosen step."""

    def __init__(self) -> None:
        from vllm import _custom_ops as ops

        self.ops = ops
        self.meta_fn = ops.cpu_attn_get_scheduler_metadata
        self.attn_fn = ops.cpu_attention_with_kv_cache
        self.step = 0
        self.target: int | None = None
        self.want = False
        self.meta_kw: dict[str, Any] | None = None
        self.call: dict[str, Any] | None = None
        ops.cpu_attn_get_scheduler_metadata = self._meta
        ops.cpu_attention_with_kv_cache = self._attn

    def arm(self, target: int) -> None:
        self.step, self.target, self.call, self.meta_kw = 0, target, None, None

    def _meta(self, *args: Any, **kw: Any):
        self.step += 1  # one metadata build per step (one KV cache group)
        if self.step == self.target:
            self.meta_kw = {k: (v.clone() if hasattr(v, "clone") else v) for k, v in kw.items()}
            self.want = True
        return self.meta_fn(*args, **kw)

    def _attn(self, **kw: Any):
        self.attn_fn(**kw)
        if self.want:
            self.want = False
            self.call = {k: (v.clone() if hasattr(v, "clone") and k not in
                             ("key_cache", "value_cache") else v) for k, v in kw.items()}

    def replay_ms(self, order: list[int], repeats: int = 20) -> float:
        import torch

        call, meta_kw = self.call, self.meta_kw
        assert call is not None and meta_kw is not None
        perm = torch.tensor(order)
        seq = call["seq_lens"][perm].contiguous()
        args = dict(call, query=call["query"][perm].contiguous(),
                    output=torch.empty_like(call["output"]), seq_lens=seq,
                    block_table=call["block_table"][perm].contiguous(),
                    scheduler_metadata=self.meta_fn(**{**meta_kw, "seq_lens": seq}))
        for _ in range(3):
            self.attn_fn(**args)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            self.attn_fn(**args)
            times.append(time.perf_counter() - t0)
        times.sort()
        return 1000 * times[len(times) // 2]


def orders(call: dict[str, Any]) -> tuple[dict[str, list[int]], dict[str, int]]:
    seq = call["seq_lens"]
    n = seq.numel()
    assert call["query"].shape[0] == n, "not a pure decode step"
    first = [int(call["block_table"][i, 0]) for i in range(n)]
    ident = list(range(n))
    members: dict[int, list[int]] = {}
    for i in ident:
        members.setdefault(first[i], []).append(i)
    grouped = [i for f in members.values() for i in f]
    rr = sorted(ident, key=lambda i: (members[first[i]].index(i), list(members).index(first[i])))
    shuffled = ident[:]
    random.Random(0).shuffle(shuffled)
    adjacent = sum(1 for i in range(1, n) if first[i] == first[i - 1])
    info = {"requests": n, "context_tokens": int(seq.sum()), "families": len(members),
            "adjacent_sibling_pairs": adjacent,
            "possible_sibling_pairs": n - len(members)}
    return dict(zip(ORDERS, (ident, grouped, rr, shuffled))), info


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=None,
                   help="directory for attention_order.{json,md} (default: "
                        f"{default_out_dir()}; the published page changes only with "
                        "--out docs/benchmarks)")
    return p


def output_dir(args: argparse.Namespace) -> Path:
    """Where the run writes: ``--out``, else the user cache (never docs/)."""
    return args.out if args.out is not None else default_out_dir()


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.out = output_dir(args)
    setup_env(1)
    cap = Capture()
    from benchmarks import forkjoin
    from benchmarks.__main__ import profiles
    from benchmarks.common import Bench, bench_model, environment

    profile = profiles()["full"]
    profile.model = bench_model(profile.size, profile.dtype)
    profile.settings["engines"]["kv_tokens"] = 49152
    bench = Bench(profile, log=print)
    bench.prime()
    kv = profile.settings["engines"]["kv_tokens"]
    bench.engine("native", "hooks-arrival", kv_tokens=kv, scripted=True)
    bench.engine("stock_scripted", "stock", kv_tokens=kv, scripted=True)
    bench.probe("native", track_parked=True)
    bench.probe("stock_scripted")
    forkjoin.warm_up(bench, ("native", "stock_scripted"))
    point = {**profile.settings["forkjoin"]["shape"], "context": 1024, "k": 4, "batch": 16}
    sep = list(bench.engines["native"].special_kwargs.merge_separator_token_ids or ())
    fams = forkjoin.families(point, 0, sep)
    rows = []
    for config, label in (("native", "native hooks, vLLM's batch order"),
                          ("loop", "client loop over stock vLLM")):
        for step in CAPTURE_STEPS:
            cap.arm(step)
            run = forkjoin.run_one(bench, config, fams)
            assert run["correct"], config
            plans, info = orders(cap.call)
            times = {name: cap.replay_ms(order) for name, order in plans.items()}
            rows.append({"config": label, "step": step, **info, "attention_ms": times})
            print(f"{label}, step {step}: {info} " +
                  ", ".join(f"{k} {v:.2f} ms" for k, v in times.items()), flush=True)
    env = environment([])
    env["command"] = "python -m benchmarks.attention_order"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "attention_order.json").write_text(
        json.dumps({"environment": env, "point": point, "rows": rows}, indent=1) + "\n")
    lines = [
        "# Attention cost vs the order of requests in the batch",
        "",
        f"`{env['command']}` on {env['date']}, {env['cpu']}, {env['cores']} cores, "
        f"vLLM {env['vllm']}, commit {env['git_commit']}. Discussion: [README.md](README.md).",
        "",
        "One decode step of the children's phase (16 families x 4 children, 1,024-token "
        "contexts, 99M bf16 model): the CPU attention call of one layer, replayed alone "
        "(median of 20) with its rows reordered. Same inputs, same KV cache.",
        "",
        "| run | step | requests | sibling pairs adjacent | " + " | ".join(
            f"{o} (ms)" for o in ORDERS) + " |",
        "| --- | ---: | ---: | ---: | " + " | ".join("---:" for _ in ORDERS) + " |",
    ]
    for r in rows:
        lines.append(f"| {r['config']} | {r['step']} | {r['requests']} | "
                     f"{r['adjacent_sibling_pairs']} of {r['possible_sibling_pairs']} | " +
                     " | ".join(f"{r['attention_ms'][o]:.2f}" for o in ORDERS) + " |")
    (args.out / "attention_order.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out / 'attention_order.md'} and attention_order.json")
    bench.close_all()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
