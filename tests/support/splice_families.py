"""Random Multiverse-format families through a splice join on the tiny
model, and what the transformers oracle says each parent should write
after its join (tests; one engine per run, in the calling process's
engine mode; :func:`run_many` runs several one after another)."""

from __future__ import annotations

import random
import string
from typing import Any

from tests.support.torch_threads import one_torch_thread
from vllm_seqhooks.core.splice_layout import Parallel

LETTERS = string.ascii_letters + "  "
LEAD_HEADER = "\n<Path>\n{n}:"
SUFFIX = "\n<Conclusion>\n"


def family_scripts(rng: random.Random, nested: bool = False,
                   twice: bool = False) -> dict[str, Any]:
    """A prompt, the parent's text up to its fork, and 1-4 children of
    unequal length, some ending at ``</Path>``, some at EOS. ``nested``:
    child 0 forks 1-3 children of its own, then goes on and ends at
    ``</Path>`` (``inner``: its text up to its fork, and after its join).
    ``twice``: after its join the parent writes ``mid`` and forks 2-3
    children again (``second``: how many)."""
    k = rng.randint(2 if nested else 1, 4)
    words = lambda lo, hi: "".join(rng.choice(LETTERS) for _ in range(rng.randint(lo, hi)))
    goal = lambda n: "<Parallel>\n<Goal>\n" + "".join(
        f"<Outline>\n{i + 1}: {words(1, 4)}\n</Outline>\n" for i in range(n)) + "</Goal>"
    children = {str(i): words(1, 16) + ("</Path>" if rng.random() < 0.7 else "")
                for i in range(k)}
    inner = None
    if nested:
        m = rng.randint(1, 3)
        inner = {"before": words(1, 6) + goal(m),
                 "after": words(1, 4) + "</Conclusion>\n</Parallel>\n" + words(1, 4) + "</Path>"}
        children["0"] = inner["before"] + inner["after"]
        children.update({f"0.{j}": words(1, 12) + "</Path>" for j in range(m)})
    before = first = goal(k)
    second, mid = 0, None
    if twice:
        second = rng.randint(2, 3)
        mid = words(1, 50) + "</Conclusion>\n</Parallel>\n"
        before += mid + goal(second)
        children.update({str(k + j): words(1, 16) + "</Path>" for j in range(second)})
    return {"prompt": words(3, 90), "before": before, "children": children, "inner": inner,
            "second": second, "first": first}


def run_families(model: str, seed: int, families: int, block_size: int = 32,
                 join: str = "splice", free: int = 24, nested: bool = False,
                 twice: bool = False, **engine_kwargs: Any) -> dict:
    """Run ``families`` random families in one batch; return, per family,
    the prompt and output ids, the children's outputs (from the trace) and
    the joins' modes, and the engine's splice counters."""
    import os

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm_seqhooks.llm import LLM
    from tests.support.forkjoin import Scripts, scripted_engine_kwargs

    llm = LLM(model, special_kwargs={"format": "multiverse", "join": join,
                                     "fork_min_tokens": None,
                                     "max_child_depth": 2 if nested else 1},
              **scripted_engine_kwargs(model, block_size=block_size, max_model_len=1024,
                                       **engine_kwargs))
    S = Scripts(llm.get_tokenizer())
    rng = random.Random(seed)
    scripts = [family_scripts(rng, nested, twice) for _ in range(families)]
    prompts = [{"prompt_token_ids": S(s["prompt"])} for s in scripts]
    params = [S.params(s["before"], s["children"], end="free", child_end="eos",
                       max_tokens=len(S(s["before"])) + free) for s in scripts]
    try:
        outs = llm.generate(prompts, params, use_tqdm=False)
        return _result(llm, S, scripts, prompts, outs)
    finally:
        llm.llm_engine.engine_core.shutdown()


def run_many(model: str, runs: dict[str, dict[str, Any]]) -> dict[str, dict]:
    """:func:`run_families` with each of ``runs``' keyword arguments, one
    engine after another in this process (the runs of one engine mode)."""
    from tests.support.engine_modes import one_engine_after_another

    return one_engine_after_another(run_families, model, runs)


def _result(llm, S, scripts, prompts, outs) -> dict:
    from vllm_seqhooks import get_hook_trace
    from tests.support.forkjoin import kv_blocks_in_use, scheduler_of

    result = []
    for s, prompt, out in zip(scripts, prompts, outs):
        trace = get_hook_trace(out)
        result.append({
            "prompt": prompt["prompt_token_ids"],
            "before": S(s["before"]),
            "output": list(out.outputs[0].token_ids),
            "children": [list(c["output_token_ids"]) for c in trace["children"]],
            "inner": None if s["inner"] is None else {
                "before": S(s["inner"]["before"]), "after": S(s["inner"]["after"]),
                "children": [list(c["output_token_ids"]) for c in trace["children"][0]["children"]],
                "modes": [j.get("mode") for j in trace["children"][0]["joins"]]},
            "modes": [j.get("mode") for j in trace["joins"]],
            "second": s["second"], "first": S(s["first"]),
            "recomputed": sum(c.get("splice_recomputed_tokens", 0) for c in trace["children"]),
            "prefilled": [j["prefilled_tokens"] for j in trace["joins"]],
            "after_spill": [j.get("splice_after_spill", False) for j in trace["joins"]],
            "parent_recomputed": trace.get("splice_recomputed_tokens", 0),
        })
    sched = scheduler_of(llm)
    return {"families": result, "stats": sched.hook_stats,
            "idle": kv_blocks_in_use(llm) == 0 and not sched.requests,
            "sizes": sched.hook_state_sizes(),
            "lead_header": [S(LEAD_HEADER.format(n=i + 1)) for i in range(4)],
            "suffix": S(SUFFIX)}


def oracle_check(model_dir: str, run: dict, compare: int | None = None,
                 causal: bool = False) -> list[dict]:
    """For each family: the parent's free tokens after its join, and the
    oracle's greedy tokens for the same merged sequence laid out as a
    splice (and, with ``causal``, as one causal sequence)."""
    # (one thread: no OpenMP threads spinning against the engine processes
    # the tests run beside it)
    with one_torch_thread():
        return _oracle_checks(model_dir, run, compare, causal)


def _oracle_checks(model_dir: str, run: dict, compare: int | None,
                   causal: bool) -> list[dict]:
    from tests.support import splice_oracle

    model = splice_oracle.load(model_dir)
    checks = []
    for fam in run["families"]:
        lead = run["lead_header"]
        second = fam["second"]  # children of a second fork, after the first join
        first = len(fam["children"]) - second
        fork = len(fam["prompt"]) + len(fam["first"])
        paths = [len(lead[i]) + len(c) for i, c in enumerate(fam["children"][:first])]
        paths2 = [len(lead[j]) + len(c) for j, c in enumerate(fam["children"][first:])]
        suffix = len(run["suffix"])
        between = len(fam["before"]) - len(fam["first"])  # to the second fork
        ids = fam["prompt"] + fam["output"]
        cut = fork + sum(paths) + suffix + between + sum(paths2) + (suffix if second else 0)
        got = ids[cut:][:compare]
        layouts = [(n,) for n in paths]
        inner = fam["inner"]
        if inner is not None:  # child 0 forked: its path holds its own paths
            inner_paths = [len(lead[j]) + len(c) for j, c in enumerate(inner["children"])]
            layouts[0] = (len(lead[0]) + len(inner["before"]),
                          Parallel(tuple((n,) for n in inner_paths)),
                          suffix + len(inner["after"]))
            assert sum(layouts[0][::2]) + sum(inner_paths) == paths[0]
        layout = (fork, Parallel(tuple(layouts)), suffix)
        if second:
            layout = (*layout[:2], suffix + between, Parallel(tuple((n,) for n in paths2)),
                      suffix)
        checks.append({
            "got": got,
            "splice": splice_oracle.greedy_after_join(model, ids[:cut], layout, len(got)),
            "causal": splice_oracle.greedy_causal(model, ids[:cut], len(got)) if causal else None,
            "paths": paths, "fork": fork,
        })
    return checks
