"""Two in-process hook engines in one process, one stepping in a thread
while the other scores prompts (tests/test_in_process_steps.py)."""

from __future__ import annotations

from typing import Any

PROMPTS = [[(7 * i + 3 * j) % 90 + 5 for j in range(n)] for i, n in enumerate((40, 120, 300))]


def score_beside_another_engine(model: str, seconds: float) -> dict[str, Any]:
    """Prompt logprobs from engine ``a`` alone, then again and again for
    ``seconds`` while engine ``b`` generates in another thread: the largest
    difference from alone, how many scorings and batches of ``b`` ran, and
    what ``b``'s thread raised; and whether each engine was freed when it
    was dropped."""
    import os
    import threading
    import time

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import SamplingParams

    from vllm_seqhooks.scripted.llm import hook_llm

    a, b = hook_llm(model), hook_llm(model)
    scoring = SamplingParams(max_tokens=1, prompt_logprobs=0,  # (hooks off: a scoring)
                             extra_args={"seqhooks_enabled": False})

    def score() -> list[float]:
        outs = a.generate([{"prompt_token_ids": p} for p in PROMPTS], scoring, use_tqdm=False)
        return [d[p[k]].logprob for o, p in zip(outs, PROMPTS)
                for k, d in enumerate(o.prompt_logprobs) if d]

    alone = score()
    stop, batches, errors = threading.Event(), [0], []

    def generate_on_b() -> None:
        params = SamplingParams(max_tokens=16, ignore_eos=True)
        try:
            while not stop.is_set():
                b.generate([{"prompt_token_ids": PROMPTS[1]}] * 8, params, use_tqdm=False)
                batches[0] += 1
        except Exception as e:  # (reported, not raised in the thread)
            errors.append(f"{type(e).__name__}: {e}")

    thread = threading.Thread(target=generate_on_b, daemon=True)
    thread.start()
    worst, runs, t0 = 0.0, 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        worst = max(worst, max(abs(x - y) for x, y in zip(score(), alone)))
        runs += 1
    stop.set()
    thread.join(timeout=120)
    # Each engine goes when its last reference does, not at some later
    # collection, where its teardown would take the process's parallel
    # groups from under another engine (in_process_steps).
    import gc
    import weakref

    engines = [weakref.ref(x.llm_engine) for x in (a, b)]
    gc.disable()
    try:
        del a, b
        freed = [e() is None for e in engines]
    finally:
        gc.enable()
    return {"worst": worst, "runs": runs, "batches": batches[0], "errors": errors,
            "freed_without_the_collector": freed}
