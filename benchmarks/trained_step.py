"""Scheduler time per scheduled request-step on the embedded trained model.

``python -m benchmarks.trained_step [--prompts 96] [--repeats 5] [--out docs/benchmarks]``

The workload issue 20 measured first: the embedded trained fork/join model
(:mod:`vllm_seqhooks.tasks.forkjoin`: each held-out problem of 13-16 digits
makes the model write its promises, each child sorts a chunk, the parent
merges), greedy, ``--prompts`` problems at once, the model deciding where
to fork. Through:

* ``native``: ``vllm_seqhooks.LLM`` with the model's hook settings, one
  ``generate`` call;
* ``loop``: the project's client loop over a stock ``vllm.LLM``
  (:class:`vllm_seqhooks.loops.promise_loop.ClientLoop`: one ``generate``
  call per round for every parent, then one for their children; the only
  client loop that builds children from their payloads, as this model's
  settings ask);
* ``loop_b``: ``loop`` again on a second stock engine (the A/A control).

Timed on every engine the same way (:class:`benchmarks.common.EngineProbe`):
seconds inside ``schedule()``, ``update_from_output()`` and EngineCore's
building and adding of a client's requests; the model and the frontend
excluded. Native does its fork/join work (scanning, spawning, merging)
inside ``update_from_output``; the loop does it in its own Python between
``generate`` calls, so each loop is reported twice: its scheduler alone,
and with its own work added (``ClientLoop.stats``: the loop's seconds
outside its ``generate`` calls), the comparison with both sides' fork/join
work inside. Per scheduled request-step (the requests a step scheduled),
median over repeats, configurations interleaved after one unmeasured run
each; every run's texts are checked against native's first.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks.common import EngineProbe, close_engine, fmt_spread, interleaved, spread

CONFIGS = ("native", "loop", "loop_b")
BASELINE = "loop"
#: The ratios: ``<config> / loop`` (scheduler only) and the same with each
#: loop's own work added (suffix).
WITH_OWN_WORK = ", loop's own work included"


def _engines() -> dict[str, Any]:
    from vllm import LLM as StockLLM

    from vllm_seqhooks import LLM
    from vllm_seqhooks.tasks import forkjoin as task

    model = str(task.model_dir())
    return {
        "native": LLM(model, special_kwargs=task.hook_settings(), **task.ENGINE_KWARGS),
        "loop": StockLLM(model, **task.ENGINE_KWARGS),
        "loop_b": StockLLM(model, **task.ENGINE_KWARGS),
    }


def _run(config: str, llm: Any, probe: EngineProbe, prompts: list[str]) -> tuple[dict, list]:
    from vllm import SamplingParams

    from vllm_seqhooks.loops.promise_loop import ClientLoop
    from vllm_seqhooks.tasks import forkjoin as task

    params = SamplingParams(temperature=0.0, max_tokens=task.PARENT_MAX_TOKENS)
    llm.reset_prefix_cache()
    probe.reset()
    client_s = 0.0  # the client loop's own work, outside its generate calls
    if config == "native":
        texts = [o.outputs[0].text
                 for o in llm.generate(prompts, params, use_tqdm=False)]
    else:
        loop = ClientLoop(llm, task.hook_settings())
        texts = [r.text for r in loop.generate(prompts, params)]
        stats = loop.stats
        client_s = stats["seconds"] - stats["parent_seconds"] - stats["child_seconds"]
    c = probe.take()
    request_steps = max(1, c.scheduled_request_steps)
    return {"scheduler_s": c.scheduler_s, "client_s": client_s, "steps": c.steps,
            "scheduled_request_steps": c.scheduled_request_steps,
            "scheduler_us_per_request_step": 1e6 * c.scheduler_s / request_steps,
            "with_client_us_per_request_step": 1e6 * (c.scheduler_s + client_s) / request_steps,
            "scheduler_us_per_step": 1e6 * c.scheduler_s / max(1, c.steps),
            "requests_per_step": c.scheduled_request_steps / max(1, c.steps)}, texts


def run(n_prompts: int, repeats: int) -> dict[str, Any]:
    from vllm_seqhooks.tasks import forkjoin as task

    problems = task.heldout_problems(n_prompts)
    prompts = [p.prompt for p in problems]
    engines = _engines()
    probes = {name: EngineProbe(llm, log_steps=False) for name, llm in engines.items()}
    try:
        reference = _run("native", engines["native"], probes["native"], prompts)[1]
        for name in ("loop", "loop_b"):
            _run(name, engines[name], probes[name], prompts)  # unmeasured first run

        def one(config: str, _r: int) -> dict[str, Any]:
            row, texts = _run(config, engines[config], probes[config], prompts)
            row["same_text"] = texts == reference
            return row

        runs = interleaved(list(CONFIGS), repeats, one)
    finally:
        for llm in engines.values():
            close_engine(llm)
    out: dict[str, Any] = {"prompts": n_prompts, "repeats": repeats,
                           "correct": sum(task.check(p, t) for p, t in zip(problems, reference))}
    for c in CONFIGS:
        out[c] = {k: spread([r[k] for r in runs[c]])
                  for k in ("scheduler_us_per_request_step", "with_client_us_per_request_step",
                            "scheduler_us_per_step", "requests_per_step", "steps")}
        out[c]["same_text"] = all(r["same_text"] for r in runs[c])
    for c in ("native", "loop_b"):
        for key, label in (("scheduler_us_per_request_step", ""),
                           ("with_client_us_per_request_step", WITH_OWN_WORK)):
            out[f"{c} / {BASELINE}{label}"] = spread([
                a[key] / b[key] for a, b in zip(runs[c], runs[BASELINE])])
    return out


def report(results: dict[str, Any], command: str, env: dict[str, Any]) -> str:
    lines = [
        "# Scheduler time per scheduled request-step, embedded trained model",
        "",
        f"Command: `{command}` (what is timed: `benchmarks/trained_step.py`). "
        f"Commit {env.get('git_commit', '?')}; {env.get('cpu', '?')}, {env.get('cores', '?')} "
        f"cores. {results['prompts']} held-out problems at once, greedy "
        f"({results['correct']} answered correctly by native). Median [min–max] of "
        f"{results['repeats']} interleaved repeats.",
        "",
        "| configuration | engine steps | requests per step | scheduler µs / step | "
        "scheduler µs / request-step | with the loop's own work | same text as native |",
        "| --- | ---: | ---: | ---: | ---: | ---: | :---: |",
    ]
    for c in CONFIGS:
        p = results[c]
        lines.append(f"| {c} | {p['steps']['median']:.0f} | "
                     f"{fmt_spread(p['requests_per_step'], 1)} | "
                     f"{fmt_spread(p['scheduler_us_per_step'], 0)} | "
                     f"{fmt_spread(p['scheduler_us_per_request_step'], 1)} | "
                     f"{fmt_spread(p['with_client_us_per_request_step'], 1)} | "
                     f"{'yes' if p['same_text'] else 'NO'} |")
    lines += ["", "| ratio per scheduled request-step (same repeat) | scheduler only | "
              "with the loop's own work |", "| --- | ---: | ---: |"]
    for c, label in (("native", "native / loop"), ("loop_b", "loop_b / loop (A/A control)")):
        ratio = f"{c} / {BASELINE}"
        lines.append(f"| {label} | {fmt_spread(results[ratio], 3)} | "
                     f"{fmt_spread(results[ratio + WITH_OWN_WORK], 3)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from benchmarks.common import environment, publish, setup_env

    parser = argparse.ArgumentParser(prog="python -m benchmarks.trained_step",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None,
                        help="write trained_step.{json,md} there")
    args = parser.parse_args(argv)
    setup_env(1)
    env = environment(argv)
    results = run(args.prompts, args.repeats)
    command = f"python -m benchmarks.trained_step --prompts {args.prompts} --repeats {args.repeats}"
    publish(args.out, "trained_step", {"environment": env, **results},
            report(results, command, env))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
