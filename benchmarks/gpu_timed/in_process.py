"""The grid's ``native-in-process`` configuration: ``vllm_seqhooks.LLM``
with ThreadWeaver's format on a GPU-timed engine, in the grid's own process
(vLLM's ``LLM`` entry point: its engine core and worker in processes of
their own, as ``LLM`` starts them).

The families are the grid's: the same plain prompts, the engine's trace
book picking each one's trace (as the servers' do). Every family is added
at once and the engine stepped until all finish (``LLMEngine.step``, what
``LLM.generate`` runs), so each family's latency is the time its finished
output came back, as a client of ``LLM`` would see it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

FILLER_TOKEN = 40


def start_engine(model: str, profile: str, workdir: Path, *, scale: float,
                 prompt_tokens: int):
    """The engine (and its counters' file), its processes moved to the
    engine half of the CPUs (:mod:`.host_split`)."""
    from tests.support.async_scheduling import force_async_scheduling
    from vllm_seqhooks.llm import LLM

    from benchmarks.gpu_timed.engine_args import ENGINE_SIZE, gpu_timed_engine_args
    from benchmarks.gpu_timed.grid import FORMAT
    from benchmarks.gpu_timed.host_split import split_host
    from benchmarks.gpu_timed.timed_scheduler import time_the_hook_scheduler

    force_async_scheduling()
    time_the_hook_scheduler()
    stats = workdir / "native-in-process.stats.json"
    kw = dict(**ENGINE_SIZE, disable_log_stats=True,
              **gpu_timed_engine_args(profile, filler_token=FILLER_TOKEN,
                                      stats_path=str(stats),
                                      scheduler_stats_path=f"{stats}.sched", hooks=True,
                                      traces={"mode": "native", "scale": scale,
                                              "prompt_tokens": prompt_tokens}))
    llm = LLM(model, special_kwargs=FORMAT, **kw)
    split_host(os.getpid())
    return llm, stats


def run(llm, fams: list, max_tokens: int) -> dict[str, Any]:
    """Every family at once; their latencies, output tokens and duration."""
    from vllm import SamplingParams

    engine = llm.llm_engine
    params = SamplingParams(max_tokens=max_tokens, temperature=0)
    t0 = time.perf_counter()
    for i, f in enumerate(fams):
        engine.add_request(f"family{i}", {"prompt_token_ids": list(f.prompt_ids)}, params)
    latencies: dict[str, float] = {}
    tokens = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                # (the id as given, or with a suffix vLLM adds after a "-")
                latencies[out.request_id.split("-")[0]] = time.perf_counter() - t0
                tokens += len(out.outputs[0].token_ids)
    if len(latencies) != len(fams):
        raise RuntimeError(f"{len(latencies)} of {len(fams)} families finished")
    return {"latencies": [latencies[f"family{i}"] for i in range(len(fams))],
            "total_output_tokens": tokens, "duration": time.perf_counter() - t0}
