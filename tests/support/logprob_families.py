"""A scripted family asked with ``logprobs`` on the tiny model, in the
calling process's engine mode (tests/test_hook_logprobs.py runs it in each
mode): its tokens, each token's row, and its rollout rows."""

from __future__ import annotations

from typing import Any


def run_family(model: str, spec: dict[str, Any], script: str,
               children: dict[str, str]) -> dict[str, Any]:
    import os

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm_seqhooks import rollout
    from vllm_seqhooks.core.trace import raw_trace
    from vllm_seqhooks.llm import LLM
    from tests.support.forkjoin import (
        Scripts,
        fill_kv_cache_with_noise,
        scheduler_of,
        scripted_engine_kwargs,
    )

    llm = LLM(model, special_kwargs=spec, **scripted_engine_kwargs(model))
    # (every KV slot noise until a request writes it: a token that attends
    # to a slot its recorded context did not write fails the comparison)
    fill_kv_cache_with_noise(llm)
    S = Scripts(llm.get_tokenizer())
    params = S.params(script, children, max_tokens=200, logprobs=2)
    (out,) = llm.generate(["Q: one"], params, use_tqdm=False)
    comp = out.outputs[0]
    sizes = scheduler_of(llm).hook_state_sizes()
    (row,) = rollout.training_rows(out)
    return {
        "token_ids": list(comp.token_ids),
        "rows": [{str(t): e.logprob for t, e in entry.items()} for entry in comp.logprobs],
        "cumulative_logprob": comp.cumulative_logprob,
        "row": row,
        "calls": rollout.per_call_rows(out),
        "modes": [j["mode"] for j in raw_trace(out)["joins"]],
        "joins": [{"at": j["at"], "splice_paths": j.get("splice_paths")}
                  for j in raw_trace(out)["joins"]],
        "leftover": {k: v for k, v in sizes.items() if v},
        "process": process_state(),
    }


def process_state() -> dict[str, Any]:
    """What a float reduction's order can depend on in this process (shown
    when a comparison fails): torch's thread count, the CPUs it may run
    on, the OpenMP settings."""
    import os

    import torch

    return {"torch_threads": torch.get_num_threads(), "cpus": sorted(os.sched_getaffinity(0)),
            "omp": {k: v for k, v in os.environ.items() if k.startswith(("OMP_", "KMP_", "GOMP_"))}}


def run_many(model: str, cases: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """:func:`run_family` with each of ``cases``' keyword arguments, one
    engine after another in this process (the cases of one engine mode)."""
    from tests.support.engine_modes import one_engine_after_another

    return one_engine_after_another(run_family, model, cases)
