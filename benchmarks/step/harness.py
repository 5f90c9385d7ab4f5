"""What the step workloads share: the timed step of the surgical scheduler
harness, repeats over sizes and configurations, their statistics, and the
page's header and tables."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from benchmarks.common import interleaved, spread


@dataclass
class Options:
    """What a workload's ``run`` reads (``python -m benchmarks.step``'s
    options)."""

    #: The workload's sizes (live requests, slots, families or problems).
    sizes: list[int] = field(default_factory=list)
    repeats: int = 5
    #: ``scheduler``: timed steps per run.
    steps: int = 40
    #: ``engine``: the engines and model of ``python -m benchmarks --PROFILE``.
    profile: str = "quick"
    #: ``engine``: where the benchmark model is built (None: ~/.cache).
    cache_dir: Path | None = None


def timed_step(h: Any, client: Any = None) -> tuple[float, int]:
    """One sync step of the surgical harness ``h``: the seconds spent in
    ``schedule()`` and ``update_from_output()`` (the harness's "model",
    which builds the step's output, is outside) plus, with ``client``, the
    seconds its reaction to the step's outputs spent building and adding
    requests (``client.after_step``); and the requests the step scheduled."""
    sched = h.sched
    t0 = time.perf_counter()
    out = sched.schedule()
    t1 = time.perf_counter()
    mro = h.execute(out)
    t2 = time.perf_counter()
    outputs = sched.update_from_output(out, mro)
    seconds = (t1 - t0) + (time.perf_counter() - t2)
    if client is not None:
        seconds += client.after_step(outputs)
    return seconds, len(out.num_scheduled_tokens)


def fork_round(lead: list[int], children: int) -> list[int]:
    """A scripted parent's round for the surgical harness: ``lead``, then
    ``children`` promises (``<promise>``, one payload token ``41 + j``,
    ``</promise>``), then ``<sync>``."""
    from vllm_seqhooks.scripted.tiny_model import PROMISE_END_ID, PROMISE_ID, SYNC_ID

    script = list(lead)
    for j in range(children):
        script += [PROMISE_ID, 41 + j, PROMISE_END_ID]
    return script + [SYNC_ID]


def repeat_sizes(sizes: Sequence[int], configs: Sequence[str], repeats: int,
                 measure: Callable[[str, int, int], dict[str, Any]], *,
                 warm_up: Callable[[str, int], Any] | None = None,
                 log: Callable[[str], None] = print) -> dict[int, dict[str, list[dict]]]:
    """For each size: ``warm_up(config, size)`` for every configuration
    (discarded alike), then ``repeats`` interleaved runs of
    ``measure(config, size, repeat)``. Returns size -> configuration -> its
    runs in repeat order."""
    out: dict[int, dict[str, list[dict]]] = {}
    for size in sizes:
        if warm_up is not None:
            for config in configs:
                warm_up(config, size)
        out[size] = interleaved(list(configs), repeats,
                                lambda c, r, size=size: measure(c, size, r))
        log(f"  {size}: done ({repeats} repeats of {', '.join(configs)})")
    return out


def spreads(runs: Sequence[dict[str, Any]], keys: Sequence[str]) -> dict[str, Any]:
    """``key -> spread`` over ``runs`` for each of ``keys`` present."""
    return {k: spread([r[k] for r in runs]) for k in keys if k in runs[0]}


def ratio(runs_a: Sequence[dict[str, Any]], runs_b: Sequence[dict[str, Any]],
          key: str) -> dict[str, float]:
    """The spread of ``a[key] / b[key]`` taken within each repeat."""
    return spread([a[key] / b[key] for a, b in zip(runs_a, runs_b)])


def header(title: str, workload: str, command: str, env: dict[str, Any],
           what: str) -> list[str]:
    """A page's first lines: its title, the command that regenerates it
    (what is timed: the workload's module), the commit and machine."""
    return [f"# {title}", "",
            f"Command: `{command}` (what is timed: `benchmarks/step/{workload}.py`). "
            f"Commit {env.get('git_commit', '?')}; {env.get('cpu', '?')}, "
            f"{env.get('cores', '?')} cores. {what}", ""]


def table(columns: Sequence[str], rows: Sequence[Sequence[Any]],
          align: str | None = None) -> list[str]:
    """A markdown table; ``align`` has one letter per column, ``l`` (left),
    ``r`` (right, the default) or ``c`` (centre)."""
    marks = {"l": "---", "r": "---:", "c": ":---:"}
    align = align or "r" * len(columns)
    return ["| " + " | ".join(columns) + " |",
            "| " + " | ".join(marks[a] for a in align) + " |",
            *("| " + " | ".join(str(c) for c in row) + " |" for row in rows)]
