"""Workload ``trained``: scheduler time per scheduled request-step on the
embedded trained model.

``python -m benchmarks.step --workload trained [--sizes 96] [--repeats 5]``

The workload issue 20 measured first: the embedded trained fork/join model
(:mod:`vllm_seqhooks.tasks.forkjoin`: each held-out problem of 13-16 digits
makes the model write its promises, each child sorts a chunk, the parent
merges), greedy, ``--sizes`` problems at once, the model deciding where
to fork. Through:

* ``native``: ``vllm_seqhooks.LLM`` with the model's hook settings, one
  ``generate`` call;
* ``loop``: the project's client loop over a stock ``vllm.LLM``
  (:class:`vllm_seqhooks.loops.promise_loop.ClientLoop`, lockstep: one
  ``generate`` call per round for every parent, then one for their
  children; its children built from their payloads, as this model's
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

from typing import Any

from benchmarks.common import EngineProbe, close_engine, fmt_spread
from benchmarks.step.harness import Options, header, ratio, repeat_sizes, spreads, table

TITLE = "Scheduler time per scheduled request-step, embedded trained model"
SIZES = "problems"
DEFAULT_SIZES = [96]
CONFIGS = ("native", "loop", "loop_b")
KEYS = ("scheduler_us_per_request_step", "with_client_us_per_request_step",
        "scheduler_us_per_step", "requests_per_step", "steps")
BASELINE = "loop"
#: The ratios: ``<config> / loop`` (scheduler only) and the same with each
#: loop's own work added (suffix).
WITH_OWN_WORK = ", loop's own work included"


def engines() -> dict[str, Any]:
    from vllm import LLM as StockLLM

    from vllm_seqhooks import LLM
    from vllm_seqhooks.tasks import forkjoin as task

    model = str(task.model_dir())
    return {
        "native": LLM(model, special_kwargs=task.hook_settings(), **task.ENGINE_KWARGS),
        "loop": StockLLM(model, **task.ENGINE_KWARGS),
        "loop_b": StockLLM(model, **task.ENGINE_KWARGS),
    }


def measure(config: str, llm: Any, probe: EngineProbe, prompts: list[str]
            ) -> tuple[dict[str, Any], list[str]]:
    """One run of ``prompts``: its counters and the texts it gave."""
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
    return {"scheduler_us_per_request_step": 1e6 * c.scheduler_s / request_steps,
            "with_client_us_per_request_step": 1e6 * (c.scheduler_s + client_s) / request_steps,
            "scheduler_us_per_step": 1e6 * c.scheduler_s / max(1, c.steps),
            "requests_per_step": c.scheduled_request_steps / max(1, c.steps),
            "steps": c.steps}, texts


def run(opts: Options, log=print) -> dict[str, Any]:
    from vllm_seqhooks.tasks import forkjoin as task

    problems = {n: task.heldout_problems(n) for n in opts.sizes}
    llms = engines()
    probes = {name: EngineProbe(llm, log_steps=False) for name, llm in llms.items()}
    reference: dict[int, list[str]] = {}

    def warm_up(config: str, n: int) -> None:
        # Native's first run is the reference the others' texts must give.
        texts = measure(config, llms[config], probes[config], [p.prompt for p in problems[n]])[1]
        reference.setdefault(n, texts)

    def one(config: str, n: int, _r: int) -> dict[str, Any]:
        row, texts = measure(config, llms[config], probes[config],
                             [p.prompt for p in problems[n]])
        return {**row, "same_text": texts == reference[n]}

    try:
        runs = repeat_sizes(opts.sizes, CONFIGS, opts.repeats, one, warm_up=warm_up, log=log)
    finally:
        for llm in llms.values():
            close_engine(llm)
    points = {}
    for n, by_config in runs.items():
        out: dict[str, Any] = {"correct": sum(task.check(p, t)
                                              for p, t in zip(problems[n], reference[n]))}
        for c, rs in by_config.items():
            out[c] = {**spreads(rs, KEYS), "same_text": all(r["same_text"] for r in rs)}
        for c in ("native", "loop_b"):
            for key, label in (("scheduler_us_per_request_step", ""),
                               ("with_client_us_per_request_step", WITH_OWN_WORK)):
                out[f"{c} / {BASELINE}{label}"] = ratio(by_config[c], by_config[BASELINE], key)
        points[str(n)] = out
    return {"sizes": opts.sizes, "repeats": opts.repeats, "points": points}


def report(results: dict[str, Any], command: str, env: dict[str, Any]) -> str:
    correct = ", ".join(f"{p['correct']} of {n}" for n, p in results["points"].items())
    lines = header(TITLE, "trained", command, env, (
        f"Held-out problems given at once, greedy ({correct} answered correctly by native). "
        f"Median [min–max] of {results['repeats']} interleaved repeats."))
    rows = []
    for n, point in results["points"].items():
        for c in CONFIGS:
            p = point[c]
            rows.append([n, c, f"{p['steps']['median']:.0f}",
                         fmt_spread(p["requests_per_step"], 1),
                         fmt_spread(p["scheduler_us_per_step"], 0),
                         fmt_spread(p["scheduler_us_per_request_step"], 1),
                         fmt_spread(p["with_client_us_per_request_step"], 1),
                         "yes" if p["same_text"] else "NO"])
    lines += table(["problems", "configuration", "engine steps", "requests per step",
                    "scheduler µs / step", "scheduler µs / request-step",
                    "with the loop's own work", "same text as native"], rows, "rlrrrrrc")
    lines.append("")
    rows = []
    for n, point in results["points"].items():
        for c, label in (("native", "native / loop"),
                         ("loop_b", "loop_b / loop (A/A control)")):
            key = f"{c} / {BASELINE}"
            rows.append([n, label, fmt_spread(point[key], 3),
                         fmt_spread(point[key + WITH_OWN_WORK], 3)])
    lines += table(["problems", "ratio per scheduled request-step (same repeat)",
                    "scheduler only", "with the loop's own work"], rows, "rlrr")
    return "\n".join(lines) + "\n"
