"""Scheduler time per step against live requests, without a model.

``python -m benchmarks.scheduler_step [--sizes 64 256 1024 4096] [--repeats 5]
[--steps 40] [--out docs/benchmarks]``

Drives vLLM's scheduler and the hook scheduler directly, with synthetic
model-runner outputs (the surgical harness of ``tests.support``:
every scheduled request samples one token a step, as vLLM's own scheduler
tests build them), so that only ``schedule()`` and ``update_from_output()``
are timed: the "model" (the harness building the output) is outside the
timed span for every configuration alike. For each number of live requests N:

* ``stock``: vLLM's own ``Scheduler``, N plain requests;
* ``stock-b``: the same again (the A/A control: its ratio to ``stock`` is
  the noise of the measurement);
* ``hooks-unused``: the hook scheduler, N plain requests (hooks on, no hook
  token sampled);
* ``hooks-off``: the hook scheduler, N requests that turn hooks off
  (``seqhooks_enabled=false``);
* ``families``: the hook scheduler, N/5 requests that each spawn 4 children
  and park at ``<sync>``: N live requests, of which the 4N/5 children run;
* ``cycles``: the hook scheduler, N/5 requests that fork 4 children of 8
  tokens, join and fork again, round after round, at staggered phases: every
  timed step spawns, parks, joins and resumes some families. Compared with
  stock per *scheduled request-step* (its µs per step over the requests it
  scheduled), spawns and joins included;
* ``cycles-v2``: ``cycles`` with the family order Model Runner V2 (the GPU
  default) gets from the scheduler (its running requests kept in arrival
  order); ``cycles`` is the V1 runner's case, whose order is kept in the
  worker (``benchmarks.engine_step`` times that);
* ``stock-cycles``: the same work as ``cycles`` on vLLM's own scheduler,
  driven by a client loop: a parent request stops after its ``<sync>``, the
  client adds its 4 children, and when they have finished, the parent's
  continuation (its context and the children's outputs as the prompt). The
  client's ``Request`` construction and ``add_request`` are timed (EngineCore
  runs them on the scheduler's thread, as the hook scheduler runs its spawns
  inside ``update_from_output``); reading the outputs and building the
  prompts and sampling parameters are not.

Each configuration is built, brought to steady decode (every request past
its prefill and, for families, every child spawned and every parent
parked), then ``--steps`` steps are timed; a configuration's first build
and run per size (warm-up) are discarded for all alike, and configurations
run interleaved (``benchmarks.common.interleaved``); garbage left by earlier
runs is collected before the timed steps. Reported: µs per step
(median over repeats), µs per scheduled request-step, and the slope per live
request of a least-squares fit over the sizes. Sync scheduling; one token per
request per step.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from pathlib import Path
from typing import Any

CONFIGS = ("stock", "stock-b", "hooks-unused", "hooks-off", "families", "cycles",
           "cycles-v2", "stock-cycles")
CHILDREN = 4
PROMPT = 16
#: Enough tokens that nothing finishes while it is timed.
MAX_TOKENS = 400
#: ``cycles``: rounds of fork/join per family, tokens per child (EOS
#: included), and the spread of the families' phases (tokens written before
#: their first fork).
ROUNDS = 8
CYCLE_CHILD_TOKENS = 8
STAGGER = 24
CYCLE_WARM_STEPS = 30


def _harness(config: str, live: int):
    from tests.support.sched_harness import SchedHarness

    model_len = PROMPT + MAX_TOKENS + 64
    if "cycles" in config:  # a parent's context grows by its merges
        model_len = PROMPT + STAGGER + ROUNDS * (3 * CHILDREN + 2 + CHILDREN * CYCLE_CHILD_TOKENS) + 64
    blocks_per_request = -(-model_len // 32) + 1
    kwargs: dict[str, Any] = dict(
        num_blocks=live * blocks_per_request + 64, block_size=32, max_num_seqs=live,
        max_model_len=model_len, max_num_batched_tokens=max(2048, live * 2), check=False,
    )
    if config.startswith("stock"):
        kwargs["stock"] = True
    else:
        # Every family's children live at once (past 1,024 a fork's children
        # would wait for the engine's live-children limit).
        kwargs["hooks"] = {"max_children_per_request": CHILDREN * ROUNDS, "fair_share": True,
                           "max_live_children": 1 << 20, "max_descendants": CHILDREN * ROUNDS,
                           "family_token_factor": 64}
    h = SchedHarness(False, **kwargs)
    if config == "cycles-v2":
        # What the scheduler does for the V2 runner (the only difference it
        # makes on the scheduler side; the harness's "model" is the same).
        h.sched._order_output_by_family = True
    return h


def _fork_round(lead: list[int]) -> list[int]:
    """A ``cycles`` parent's round: ``lead``, then a promise per child, then
    ``<sync>`` (the next round's lead is ``[50]``)."""
    from tests.support.sched_harness import PROMISE_END_ID, PROMISE_ID, SYNC_ID

    script = list(lead)
    for j in range(CHILDREN):
        script += [PROMISE_ID, 41 + j, PROMISE_END_ID]
    return script + [SYNC_ID]


def _child_script(j: int) -> list[int]:
    """What a ``cycles`` round's child ``j`` writes, EOS included."""
    from tests.support.sched_harness import EOS_ID

    return [60 + j] * (CYCLE_CHILD_TOKENS - 1) + [EOS_ID]


def _populate(h, config: str, live: int) -> int:
    """Add the configuration's requests; the number it will keep running."""
    from tests.support.sched_harness import (
        EOS_ID, PROMISE_END_ID, PROMISE_ID, SYNC_ID, child_id)

    if config in ("cycles", "cycles-v2"):
        roots = max(1, live // (CHILDREN + 1))
        for i in range(roots):
            rid = f"c{i}"
            script: list[int] = []
            for r in range(ROUNDS):
                script += _fork_round([40] * (i % STAGGER) if r == 0 else [50])
                for j in range(CHILDREN):
                    h.scripts[child_id(rid, r * CHILDREN + j)] = _child_script(j)
            script += [50, EOS_ID]
            h.add(rid, [10 + i % 50] * PROMPT, script=script, max_tokens=len(script))
        return roots
    if config == "families":
        roots = max(1, live // (CHILDREN + 1))
        script = [40]
        for j in range(CHILDREN):
            script += [PROMISE_ID, 41 + j, PROMISE_END_ID]
        script += [SYNC_ID, 50] + [51] * MAX_TOKENS + [EOS_ID]
        for i in range(roots):
            h.add(f"f{i}", [10 + i % 50] * PROMPT, script=script, max_tokens=MAX_TOKENS)
        return roots * CHILDREN
    extra = {"seqhooks_enabled": False} if config == "hooks-off" else None
    for i in range(live):
        h.add(f"r{i}", [10 + i % 50] * PROMPT, max_tokens=MAX_TOKENS, extra_args=extra)
    return live


class _ClientLoop:
    """``stock-cycles``: the cycle workload as a client loop over stock vLLM
    (see the module docstring)."""

    def __init__(self, h, live: int) -> None:
        self.h = h
        self.rounds: dict[str, int] = {}
        self.context: dict[str, list[int]] = {}
        self.waiting_children: dict[str, dict[str, list[int]]] = {}
        self.parent_of: dict[str, str] = {}
        self.tokens: dict[str, list[int]] = {}
        for i in range(max(1, live // (CHILDREN + 1))):
            fam = f"s{i}"
            self.rounds[fam] = 0
            self.context[fam] = [10 + i % 50] * PROMPT
            self._submit_parent(fam, [40] * (i % STAGGER), timed=False)

    def _add(self, rid: str, prompt: list[int], script: list[int], timed: bool) -> float:
        from vllm import SamplingParams
        from vllm.v1.request import Request

        from tests.support.sched_setup import EOS_ID, block_hasher

        h = self.h
        h.scripts[rid] = script
        sp = SamplingParams(max_tokens=len(script), temperature=0.0)
        sp.update_from_generation_config({}, eos_token_id=EOS_ID)
        hasher = block_hasher(h.block_size)
        t0 = time.perf_counter()
        h.sched.add_request(Request(request_id=rid, prompt_token_ids=prompt, sampling_params=sp,
                                    pooling_params=None, client_index=0, arrival_time=None,
                                    block_hasher=hasher))
        return time.perf_counter() - t0 if timed else 0.0

    def _submit_parent(self, fam: str, lead: list[int], timed: bool) -> float:
        rid = f"{fam}/{self.rounds[fam]}"
        return self._add(rid, list(self.context[fam]), _fork_round(lead), timed)

    def after_step(self, outputs) -> float:
        """The client's reaction to a step's finished requests; the seconds
        its requests took to build and add."""
        from tests.support.sched_harness import EOS_ID

        spent = 0.0
        for eco in outputs.values():
            for out in eco.outputs:
                rid = out.request_id
                self.tokens.setdefault(rid, []).extend(out.new_token_ids)
                if out.finish_reason is None:
                    continue
                tokens = self.tokens.pop(rid)
                if rid in self.parent_of:  # a child finished
                    fam = self.parent_of.pop(rid)
                    self.waiting_children[fam][rid] = [t for t in tokens if t != EOS_ID]
                    if all(self.waiting_children[fam].values()):
                        merged = [t for c in self.waiting_children[fam].values() for t in c]
                        self.context[fam] += merged
                        self.rounds[fam] += 1
                        if self.rounds[fam] < ROUNDS:
                            spent += self._submit_parent(fam, [50], timed=True)
                    continue
                fam = rid.split("/")[0]
                self.context[fam] += tokens
                self.waiting_children[fam] = {}
                for j in range(CHILDREN):
                    cid = f"{rid}#{j}"
                    self.parent_of[cid] = fam
                    self.waiting_children[fam][cid] = []
                    prompt = self.context[fam] + [41 + j]
                    spent += self._add(cid, prompt, _child_script(j), timed=True)
        return spent


def _one_step(h, client: _ClientLoop | None = None) -> tuple[float, int]:
    """One sync engine step; the seconds spent in the scheduler and the
    requests it scheduled."""
    sched = h.sched
    t0 = time.perf_counter()
    out = sched.schedule()
    t1 = time.perf_counter()
    mro = h.execute(out)
    t2 = time.perf_counter()
    outputs = sched.update_from_output(out, mro)
    t3 = time.perf_counter()
    seconds = (t1 - t0) + (t3 - t2)
    if client is not None:
        seconds += client.after_step(outputs)
    return seconds, len(out.num_scheduled_tokens)


def measure(config: str, live: int, steps: int) -> dict[str, float]:
    h = _harness(config, live)
    client = None
    if config == "stock-cycles":
        client = _ClientLoop(h, live)
    else:
        running = _populate(h, config, live)
    if "cycles" in config:
        # Every family past its first prefill and into its rounds.
        for _ in range(CYCLE_WARM_STEPS):
            _one_step(h, client)
    else:
        for _ in range(200):  # to steady decode: prefills done, children spawned
            _, scheduled = _one_step(h)
            if scheduled >= running and all(
                    r.num_computed_tokens >= r.num_prompt_tokens for r in h.sched.running):
                break
        else:
            raise RuntimeError(f"{config} at {live}: no steady state")
        for _ in range(3):
            _one_step(h)
    # The garbage of earlier runs (other configurations' harnesses) is
    # collected here, not inside this run's timed steps.
    gc.collect()
    seconds, scheduled, live_sum = 0.0, 0, 0
    hook_cycles = config in ("cycles", "cycles-v2")
    joins_before = h.sched.hook_stats.get("joins", 0) if hook_cycles else 0
    for _ in range(steps):
        s, n = _one_step(h, client)
        seconds += s
        scheduled += n
        live_sum += len(h.sched.requests)
    result = {"us_per_step": 1e6 * seconds / steps, "scheduled_per_step": scheduled / steps,
              "us_per_request_step": 1e6 * seconds / max(1, scheduled),
              "live": live_sum / steps}
    if hook_cycles:
        result["joins_per_step"] = (h.sched.hook_stats["joins"] - joins_before) / steps
    return result


def _slope(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares ``y = a + b x``: (a, b)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else float("nan")
    return my - b * mx, b


def run(sizes: list[int], repeats: int, steps: int, log=print) -> dict[str, Any]:
    from benchmarks.common import interleaved

    results: dict[str, Any] = {"sizes": sizes, "repeats": repeats, "steps": steps, "points": {}}
    for live in sizes:
        for config in CONFIGS:  # warm-up, discarded alike
            measure(config, live, max(5, steps // 4))
        runs = interleaved(list(CONFIGS), repeats, lambda c, r: measure(c, live, steps))
        point = {}
        for config, rs in runs.items():
            us = statistics.median(r["us_per_step"] for r in rs)
            point[config] = {
                "us_per_step": us, "runs_us": [r["us_per_step"] for r in rs],
                "us_per_request_step": statistics.median(r["us_per_request_step"] for r in rs),
                "scheduled_per_step": statistics.median(r["scheduled_per_step"] for r in rs),
                "live": statistics.median(r["live"] for r in rs)}
            if "joins_per_step" in rs[0]:
                point[config]["joins_per_step"] = statistics.median(
                    r["joins_per_step"] for r in rs)
        results["points"][str(live)] = point
        log(f"{live:5d} live: " + "  ".join(
            f"{c} {point[c]['us_per_step']:.0f}us" for c in CONFIGS))
    results["fits"] = {
        c: dict(zip(("fixed_us", "us_per_live_request"), _slope(
            [(results["points"][str(n)][c]["live"], results["points"][str(n)][c]["us_per_step"])
             for n in sizes])))
        for c in CONFIGS
    }
    return results


def report(results: dict[str, Any], command: str) -> str:
    lines = [
        "# Scheduler time per step, without a model",
        "",
        f"Command: `{command}` (see `benchmarks/scheduler_step.py` for what is timed).",
        f"Median of {results['repeats']} interleaved repeats of {results['steps']} steps; "
        "µs spent in `schedule()` + `update_from_output()` per step. Read every ratio "
        "against the A/A column (`stock-b / stock`): a difference within its spread is noise.",
        "",
        "| live requests | " + " | ".join(CONFIGS) + " | stock-b / stock (A/A) | "
        "hooks-unused / stock | hooks-off / stock | families / stock |",
        "| ---: | " + " | ".join("---:" for _ in CONFIGS) + " | ---: | ---: | ---: | ---: |",
    ]
    for live, point in results["points"].items():
        base = point["stock"]["us_per_step"]
        cells = [f"{point[c]['us_per_step']:.0f}" for c in CONFIGS]
        ratios = [f"{point[c]['us_per_step'] / base:.2f}"
                  for c in ("stock-b", "hooks-unused", "hooks-off", "families")]
        lines.append(f"| {live} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    lines += ["", "Least-squares fit over the sizes, µs per step = fixed + slope × live "
              "requests (for `families`, live = parents parked + children running):", "",
              "| configuration | fixed µs | µs per live request | slope / stock's |",
              "| --- | ---: | ---: | ---: |"]
    stock_slope = results["fits"]["stock"]["us_per_live_request"]
    for c in CONFIGS:
        fit = results["fits"][c]
        lines.append(f"| {c} | {fit['fixed_us']:.0f} | {fit['us_per_live_request']:.2f} | "
                     f"{fit['us_per_live_request'] / stock_slope:.2f} |")
    lines += ["", "Per scheduled request-step (µs per step over the requests scheduled in "
              "it; `cycles`: spawns, parks, joins and resumes included):", "",
              "| live requests | stock µs | stock-b / stock | families / stock | "
              "cycles / stock | stock-cycles / stock | cycles / stock-cycles | "
              "cycles-v2 / stock-cycles | "
              "cycles: requests scheduled per step | cycles: joins per step |",
              "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for live, point in results["points"].items():
        base = point["stock"]["us_per_request_step"]
        cyc = point["cycles"]
        lines.append(
            f"| {live} | {base:.2f} | "
            + " | ".join(f"{point[c]['us_per_request_step'] / base:.2f}"
                         for c in ("stock-b", "families", "cycles", "stock-cycles"))
            + f" | {cyc['us_per_request_step'] / point['stock-cycles']['us_per_request_step']:.2f}"
            + f" | {point['cycles-v2']['us_per_request_step'] / point['stock-cycles']['us_per_request_step']:.2f}"
            + f" | {cyc['scheduled_per_step']:.0f} | {cyc.get('joins_per_step', 0):.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from benchmarks.common import publish

    parser = argparse.ArgumentParser(prog="python -m benchmarks.scheduler_step",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024, 4096])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out", type=Path, default=None,
                        help="write scheduler_step.{json,md} there")
    args = parser.parse_args(argv)
    results = run(args.sizes, args.repeats, args.steps)
    command = "python -m benchmarks.scheduler_step " + " ".join(
        [f"--sizes {' '.join(map(str, args.sizes))}", f"--repeats {args.repeats}",
         f"--steps {args.steps}"])
    publish(args.out, "scheduler_step", results, report(results, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
