"""verl rollouts: the engine-branching agent loop against ThreadWeaver's
client loop, both through verl's agent-loop machinery.

    python -m benchmarks.verl_rollout --out docs/benchmarks    # default size (verl_rollout.md)
    python -m benchmarks.verl_rollout --smoke                  # under a minute

``--override KEY=VALUE`` (repeatable) sets a dotted key of verl's trainer
config for both servers after the benchmark's own settings (the value read
as YAML), e.g. ``actor_rollout_ref.rollout.engine_kwargs.vllm.max_num_seqs=64``;
the results record them.

Needs verl (docs/rl.md, "verl"); from the checkout's venv, where
``scripts/setup.sh`` puts it in ``.verl`` (outside the venv), prefix
``PYTHONPATH=.verl``.

The embedded trained ThreadWeaver-format model samples ``n`` completions of
each held-out problem at temperature 1 (GRPO groups), through verl 0.9.1's
``AgentLoopWorker.generate_sequences`` over its ``LLMServerClient`` and its
``vLLMHttpServer`` (``vllm_seqhooks.integrations.verl.local``: verl's own
classes in this process, without Ray):

- ``native``: the ``seqhooks_agent`` loop over verl's server with hooks
  (one request per sample; the engine forks and joins);
- ``loop``: ThreadWeaver's ``ParallelBranchingController`` (as written again
  in ``tests/support/branching_controller.py``) in an agent loop of its own,
  over verl's server without hooks (one request per sequential stretch and
  per thread), through the same client class;
- ``loop_b``: ``loop`` again (the A/A control).

Both servers run at once (an idle one takes no CPU); the configurations
alternate within each repeat (``benchmarks.common.interleaved``). Counted
on both sides: the tokens the policy sampled (every call's tokens: the
``expanded_response_ids``, which are the same rows for both), the wall time
of ``generate_sequences``, and the reward (the task's checker). Without
logprobs on both sides (ThreadWeaver's controller drops them).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.common import environment, fmt_spread, git_commit, interleaved, publish, spread
from vllm_seqhooks.tasks import threadweaver as task

SIZES = {
    "smoke": dict(prompts=4, n=2, repeats=1),
    "default": dict(prompts=32, n=4, repeats=6),
}
CONFIGS = ("loop", "loop_b", "native")
PAIRS = {
    "A/A control: loop_b / loop": ("loop_b", "loop"),
    "native / loop": ("native", "loop"),
}
TEMPERATURE = 1.0


def _round_stats(batch: Any, problems: list[Any], tok: Any, seconds: float,
                 native: bool) -> dict[str, Any]:
    from vllm_seqhooks.integrations.verl.local import responses

    extra = batch.non_tensor_batch
    texts = [tok.decode(r, skip_special_tokens=True) for r in responses(batch)]
    index = extra["index"]
    correct = sum(task.check(problems[int(index[i])].digits, t) for i, t in enumerate(texts))
    sampled = sum(len(r) for rows in extra["expanded_response_ids"] for r in rows)
    calls = sum(len(rows) for rows in extra["expanded_response_ids"])
    return {"seconds": seconds, "sampled_tokens": sampled, "calls": calls,
            "requests": len(batch) if native else calls,
            "tokens_per_s": sampled / seconds, "samples": len(batch), "correct": int(correct)}


async def _run(size: dict[str, Any], overrides: dict[str, Any], log) -> dict[str, Any]:
    from vllm_seqhooks.integrations.verl import AGENT_NAME, local

    from benchmarks.verl_client_loop import CLIENT_LOOP_AGENT  # (registers it)

    model = str(task.model_dir())
    problems = task.heldout_problems(size["prompts"])
    settings = dict(rollout_n=size["n"], temperature=TEMPERATURE, calculate_log_probs=False,
                    response_length=192)
    stock_cfg = local.trainer_config(model, None, overrides=overrides, **settings)
    hooks_cfg = local.trainer_config(model, "auto", overrides=overrides, **settings)
    log("starting verl's server without hooks, then with")
    stock = await local.start_server(stock_cfg)
    hooks = await local.start_server(hooks_cfg)
    try:
        workers = {
            "loop": local.agent_loop_worker(stock_cfg, local.server_client(stock_cfg, stock)),
            "native": local.agent_loop_worker(hooks_cfg, local.server_client(hooks_cfg, hooks)),
        }
        agents = {"loop": CLIENT_LOOP_AGENT, "loop_b": CLIENT_LOOP_AGENT, "native": AGENT_NAME}
        prompts = [task.prompt_text(p.digits) for p in problems]

        async def one_round(config: str) -> dict[str, Any]:
            import numpy as np

            batch = local.prompts_batch(prompts, repeat=size["n"])
            batch.non_tensor_batch["agent_name"] = np.array([agents[config]] * len(batch),
                                                            dtype=object)
            worker = workers["native" if config == "native" else "loop"]
            t0 = time.perf_counter()
            out = await worker.generate_sequences(batch)
            return _round_stats(out, problems, worker.tokenizer, time.perf_counter() - t0,
                                native=config == "native")

        log("warm-up")
        for config in ("loop", "native"):
            await one_round(config)
        order: list[tuple[str, int]] = []
        interleaved(CONFIGS, size["repeats"], lambda c, r: order.append((c, r)))
        rounds: dict[str, list[dict[str, Any]]] = {c: [] for c in CONFIGS}
        for config, r in order:
            rounds[config].append(await one_round(config))
            log(f"    {config} repeat {r + 1}: {rounds[config][-1]['tokens_per_s']:.0f} tokens/s")
    finally:
        await local.stop_server(stock)
        await local.stop_server(hooks)
    return rounds


def _report(results: dict[str, Any]) -> str:
    rounds, size, env = results["rounds"], results["size"], results["environment"]
    lines = [
        "# verl rollouts: the engine-branching agent loop against ThreadWeaver's client loop",
        "",
        f"`{env['command']}` — {env['date']}, {env['cpu']}, {env['cores']} cores, "
        f"vLLM {env['vllm']}, verl {results['verl']}, commit {env['git_commit']}.",
        "",
        f"{size['prompts']} held-out problems x {size['n']} samples at temperature "
        f"{TEMPERATURE} (GRPO groups), {size['repeats']} repeats per configuration, "
        "alternating; both through verl's `AgentLoopWorker.generate_sequences`, "
        "`LLMServerClient` and `vLLMHttpServer` (the module doc of "
        "`benchmarks/verl_rollout.py` says what each configuration runs).",
        "",
        "| configuration | sampled tokens/s | seconds per round | requests to the server | call rows | sampled tokens | correct |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for config in CONFIGS:
        rs = rounds[config]
        lines.append(
            f"| `{config}` | {fmt_spread(spread([r['tokens_per_s'] for r in rs]))} | "
            f"{fmt_spread(spread([r['seconds'] for r in rs]), 2)} | "
            f"{statistics.mean(r['requests'] for r in rs):.0f} | "
            f"{statistics.mean(r['calls'] for r in rs):.0f} | "
            f"{statistics.mean(r['sampled_tokens'] for r in rs):.0f} | "
            f"{statistics.mean(r['correct'] for r in rs):.1f} / {rs[0]['samples']} |")
    lines += ["", "Ratios of tokens/s, taken within each repeat (median [min–max]):", "",
              "| ratio | value |", "| --- | --- |"]
    for name, ratio in results["ratios"].items():
        lines.append(f"| {name} | {fmt_spread(ratio, 3)} |")
    aa = results["ratios"]["A/A control: loop_b / loop"]
    lo, hi = min(aa["min"], 1 / aa["max"]), max(aa["max"], 1 / aa["min"])
    ratio = results["ratios"]["native / loop"]
    verdict = ("inside that band: no difference this run can show" if lo <= ratio["median"] <= hi
               else "outside that band")
    lines += ["", f"The A/A control spans {aa['min']:.3f}–{aa['max']:.3f}: a ratio within "
              f"{lo:.3f}–{hi:.3f} is not a difference this run can show. native / loop: "
              f"{fmt_spread(ratio, 3)}, median {verdict}.",
              "", "`native` makes one request per sample; `loop` one per sequential stretch "
              "and per thread, each prefilling its context again (the prefix cache "
              "serves what it can). Here verl's client calls its server in-process; in "
              "training each call is a Ray actor call to a server on another process or "
              "node, a cost per request that `loop` pays for every call row and `native` "
              "once per sample (not measured here)."]
    return "\n".join(lines) + "\n"


def _override(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` -> (KEY, VALUE read as YAML)."""
    import yaml

    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, yaml.safe_load(value)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--override", type=_override, action="append", default=[],
                    metavar="KEY=VALUE",
                    help="a dotted key of verl's trainer config, for both servers (repeatable)")
    ap.add_argument("--out", type=Path, default=None,
                    help="directory for verl_rollout.{json,md} (default: print only; "
                         "the published page changes only with --out docs/benchmarks)")
    args = ap.parse_args(argv)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    import verl

    size = SIZES["smoke" if args.smoke else "default"]
    command = ["python -m benchmarks.verl_rollout", *(argv if argv is not None else [])]
    env = environment(argv)
    env.update(command=" ".join(command), git_commit=git_commit(["vllm_seqhooks", "benchmarks"]))
    overrides = dict(args.override)
    rounds = asyncio.run(_run(size, overrides, lambda m: print(m, flush=True)))
    ratios = {name: spread([a["tokens_per_s"] / b["tokens_per_s"]
                            for a, b in zip(rounds[num], rounds[den])])
              for name, (num, den) in PAIRS.items()}
    results = {"size": size, "overrides": overrides, "environment": env,
               "verl": verl.__version__, "rounds": rounds, "ratios": ratios}
    publish(args.out, "verl_rollout", results, _report(results))


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
