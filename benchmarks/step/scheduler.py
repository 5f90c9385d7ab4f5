"""Workload ``scheduler``: scheduler time per step against live requests,
without a model.

``python -m benchmarks.step --workload scheduler [--sizes 64 256 1024 4096]
[--repeats 5] [--steps 40]``

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
  tokens (each round :func:`~benchmarks.step.harness.fork_round`, the
  next round's lead ``[50]``), join and fork again, round after round, at
  staggered phases: every
  timed step spawns, parks, joins and resumes some families. Compared with
  stock per *scheduled request-step* (its µs per step over the requests it
  scheduled), spawns and joins included;
* ``cycles-v2``: ``cycles`` with the family order Model Runner V2 (the GPU
  default) gets from the scheduler (its running requests kept in arrival
  order); ``cycles`` is the V1 runner's case, whose order is kept in the
  worker (the ``engine`` workload times that);
* ``stock-cycles``: the same work as ``cycles`` on vLLM's own scheduler,
  driven by a client at the scheduler's level (:class:`StockCycles`): a
  parent request stops after its ``<sync>``, the client adds its 4
  children, and when they have finished, the parent's continuation (its
  context and the children's outputs as the prompt). The client's
  ``Request`` construction and ``add_request`` are timed (EngineCore runs
  them on the scheduler's thread, as the hook scheduler runs its spawns
  inside ``update_from_output``); reading the outputs and building the
  prompts and sampling parameters are not.

Each configuration is built, brought to steady decode (every request past
its prefill and, for families, every child spawned and every parent
parked), then ``--steps`` steps are timed; a configuration's first build
and run per size (warm-up) are discarded for all alike; garbage left by
earlier runs is collected before the timed steps. Reported: µs per step,
µs per scheduled request-step (medians over repeats), and the slope per
live request of a least-squares fit over the sizes. Sync scheduling; one
token per request per step.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from benchmarks.step.harness import (
    Options, fork_round, header, repeat_sizes, spreads, table, timed_step)

TITLE = "Scheduler time per step, without a model"
SIZES = "live requests"
DEFAULT_SIZES = [64, 256, 1024, 4096]
CONFIGS = ("stock", "stock-b", "hooks-unused", "hooks-off", "families", "cycles",
           "cycles-v2", "stock-cycles")
KEYS = ("us_per_step", "us_per_request_step", "scheduled_per_step", "live", "joins_per_step")
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


def harness(config: str, live: int):
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


def child_script(j: int) -> list[int]:
    """What a ``cycles`` round's child ``j`` writes, EOS included."""
    from vllm_seqhooks.scripted.tiny_model import EOS_ID

    return [60 + j] * (CYCLE_CHILD_TOKENS - 1) + [EOS_ID]


def populate(h, config: str, live: int) -> int:
    """Add the configuration's requests; the number it will keep running."""
    from tests.support.sched_harness import child_id
    from vllm_seqhooks.scripted.tiny_model import EOS_ID

    roots = max(1, live // (CHILDREN + 1))
    if config in ("cycles", "cycles-v2"):
        for i in range(roots):
            rid = f"c{i}"
            script: list[int] = []
            for r in range(ROUNDS):
                script += fork_round([40] * (i % STAGGER) if r == 0 else [50], CHILDREN)
                for j in range(CHILDREN):
                    h.scripts[child_id(rid, r * CHILDREN + j)] = child_script(j)
            script += [50, EOS_ID]
            h.add(rid, [10 + i % 50] * PROMPT, script=script, max_tokens=len(script))
        return roots
    if config == "families":
        script = fork_round([40], CHILDREN) + [50] + [51] * MAX_TOKENS + [EOS_ID]
        for i in range(roots):
            h.add(f"f{i}", [10 + i % 50] * PROMPT, script=script, max_tokens=MAX_TOKENS)
        return roots * CHILDREN
    extra = {"seqhooks_enabled": False} if config == "hooks-off" else None
    for i in range(live):
        h.add(f"r{i}", [10 + i % 50] * PROMPT, max_tokens=MAX_TOKENS, extra_args=extra)
    return live


class StockCycles:
    """``stock-cycles``: the cycle workload as a client over stock vLLM's
    scheduler (see the module docstring): requests scripted by id, the
    children's outputs merged without a separator."""

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

        from tests.support.sched_setup import block_hasher
        from vllm_seqhooks.scripted.tiny_model import EOS_ID

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
        return self._add(rid, list(self.context[fam]), fork_round(lead, CHILDREN), timed)

    def after_step(self, outputs) -> float:
        """The client's reaction to a step's finished requests; the seconds
        its requests took to build and add."""
        spent = 0.0
        for eco in outputs.values():
            for out in eco.outputs:
                rid = out.request_id
                self.tokens.setdefault(rid, []).extend(out.new_token_ids)
                if out.finish_reason is not None:
                    spent += self._finished(rid, self.tokens.pop(rid))
        return spent

    def _finished(self, rid: str, tokens: list[int]) -> float:
        from vllm_seqhooks.scripted.tiny_model import EOS_ID

        spent = 0.0
        if rid in self.parent_of:  # a child finished
            fam = self.parent_of.pop(rid)
            self.waiting_children[fam][rid] = [t for t in tokens if t != EOS_ID]
            if all(self.waiting_children[fam].values()):
                self.context[fam] += [t for c in self.waiting_children[fam].values() for t in c]
                self.rounds[fam] += 1
                if self.rounds[fam] < ROUNDS:
                    spent += self._submit_parent(fam, [50], timed=True)
            return spent
        fam = rid.split("/")[0]
        self.context[fam] += tokens
        self.waiting_children[fam] = {}
        for j in range(CHILDREN):
            cid = f"{rid}#{j}"
            self.parent_of[cid] = fam
            self.waiting_children[fam][cid] = []
            spent += self._add(cid, self.context[fam] + [41 + j], child_script(j), timed=True)
        return spent


def _to_steady_state(h, config: str, live: int, running: int) -> None:
    for _ in range(200):  # to steady decode: prefills done, children spawned
        _, scheduled = timed_step(h)
        if scheduled >= running and all(
                r.num_computed_tokens >= r.num_prompt_tokens for r in h.sched.running):
            break
    else:
        raise RuntimeError(f"{config} at {live}: no steady state")
    for _ in range(3):
        timed_step(h)


def measure(config: str, live: int, steps: int) -> dict[str, float]:
    h = harness(config, live)
    client = None
    if config == "stock-cycles":
        client = StockCycles(h, live)
    else:
        running = populate(h, config, live)
    if "cycles" in config:
        # Every family past its first prefill and into its rounds.
        for _ in range(CYCLE_WARM_STEPS):
            timed_step(h, client)
    else:
        _to_steady_state(h, config, live, running)
    # The garbage of earlier runs (other configurations' harnesses) is
    # collected here, not inside this run's timed steps.
    gc.collect()
    seconds, scheduled, live_sum = 0.0, 0, 0
    hook_cycles = config in ("cycles", "cycles-v2")
    joins_before = h.sched.hook_stats.get("joins", 0) if hook_cycles else 0
    for _ in range(steps):
        s, n = timed_step(h, client)
        seconds += s
        scheduled += n
        live_sum += len(h.sched.requests)
    result = {"us_per_step": 1e6 * seconds / steps, "scheduled_per_step": scheduled / steps,
              "us_per_request_step": 1e6 * seconds / max(1, scheduled),
              "live": live_sum / steps}
    if hook_cycles:
        result["joins_per_step"] = (h.sched.hook_stats["joins"] - joins_before) / steps
    return result


def fit(points: list[tuple[float, float]]) -> dict[str, float]:
    """Least squares ``y = fixed + slope x`` over ``(x, y)`` points."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else float("nan")
    return {"fixed_us": my - b * mx, "us_per_live_request": b}


def run(opts: Options, log=print) -> dict[str, Any]:
    runs = repeat_sizes(opts.sizes, CONFIGS, opts.repeats,
                        lambda c, live, _r: measure(c, live, opts.steps),
                        warm_up=lambda c, live: measure(c, live, max(5, opts.steps // 4)),
                        log=log)
    points = {str(live): {c: spreads(rs, KEYS) for c, rs in by_config.items()}
              for live, by_config in runs.items()}
    fits = {c: fit([(p[c]["live"]["median"], p[c]["us_per_step"]["median"])
                    for p in points.values()]) for c in CONFIGS}
    return {"sizes": opts.sizes, "repeats": opts.repeats, "steps": opts.steps,
            "points": points, "fits": fits}


def report(results: dict[str, Any], command: str, env: dict[str, Any]) -> str:
    def us(point: dict, config: str, key: str = "us_per_step") -> float:
        return point[config][key]["median"]

    lines = header(TITLE, "scheduler", command, env, (
        f"Median of {results['repeats']} interleaved repeats of {results['steps']} steps; "
        "µs spent in `schedule()` + `update_from_output()` per step. Read every ratio "
        "against the A/A column (`stock-b / stock`): a difference within its spread is noise."))
    ratios = ("stock-b", "hooks-unused", "hooks-off", "families")
    lines += table(
        ["live requests", *CONFIGS, "stock-b / stock (A/A)", "hooks-unused / stock",
         "hooks-off / stock", "families / stock"],
        [[live, *(f"{us(p, c):.0f}" for c in CONFIGS),
          *(f"{us(p, c) / us(p, 'stock'):.2f}" for c in ratios)]
         for live, p in results["points"].items()])
    lines += ["", "Least-squares fit over the sizes, µs per step = fixed + slope × live "
              "requests (for `families`, live = parents parked + children running):", ""]
    stock_slope = results["fits"]["stock"]["us_per_live_request"]
    lines += table(
        ["configuration", "fixed µs", "µs per live request", "slope / stock's"],
        [[c, f"{f['fixed_us']:.0f}", f"{f['us_per_live_request']:.2f}",
          f"{f['us_per_live_request'] / stock_slope:.2f}"]
         for c, f in results["fits"].items()], "lrrr")
    lines += ["", "Per scheduled request-step (µs per step over the requests scheduled in "
              "it; `cycles`: spawns, parks, joins and resumes included):", ""]
    rows = []
    for live, p in results["points"].items():
        base = us(p, "stock", "us_per_request_step")
        per = {c: us(p, c, "us_per_request_step") for c in CONFIGS}
        rows.append([live, f"{base:.2f}",
                     *(f"{per[c] / base:.2f}" for c in
                       ("stock-b", "families", "cycles", "stock-cycles")),
                     f"{per['cycles'] / per['stock-cycles']:.2f}",
                     f"{per['cycles-v2'] / per['stock-cycles']:.2f}",
                     f"{us(p, 'cycles', 'scheduled_per_step'):.0f}",
                     f"{us(p, 'cycles', 'joins_per_step'):.1f}"])
    lines += table(["live requests", "stock µs", "stock-b / stock", "families / stock",
                    "cycles / stock", "stock-cycles / stock", "cycles / stock-cycles",
                    "cycles-v2 / stock-cycles", "cycles: requests scheduled per step",
                    "cycles: joins per step"], rows)
    return "\n".join(lines) + "\n"
