"""Drive the workers' splice inputs by hand, for tests of the mechanism
(``vllm_private.install_splice_inputs``) apart from the join that will use
it: a scheduler that shifts by ``SEQHOOKS_PROBE_SHIFT`` (an environment
variable) the positions of every token a request computes after its
prompt, as a parent's tokens after a splice join are shifted (a shift of
every token would change nothing: rotary attention sees only the distance
between positions), and a function that runs a tiny model under it and
checks the KV cache views the copies address."""

from __future__ import annotations

import os
from typing import Any

from vllm_seqhooks.core.splice_inputs import SpliceInputs

SHIFT_ENV = "SEQHOOKS_PROBE_SHIFT"
SCHEDULER_PATH = "tests.support.splice_probe.ShiftingScheduler"


def _shifting(base: type) -> type:
    from vllm_seqhooks.engine.vllm_private import SPLICE_INPUTS_ATTR

    class Shifting(base):
        def schedule(self, *args: Any, **kwargs: Any):
            out = super().schedule(*args, **kwargs)
            shift = int(os.environ.get(SHIFT_ENV, "0"))
            # (vLLM has already counted this step's tokens as computed)
            decoding = [rid for rid, n in out.num_scheduled_tokens.items()
                        if self.requests[rid].num_computed_tokens - n
                        >= self.requests[rid].num_prompt_tokens]
            if shift and decoding:
                setattr(out, SPLICE_INPUTS_ATTR, SpliceInputs(
                    position_shift={rid: ((0, shift),) for rid in decoding}))
            return out

    return Shifting


class ShiftingScheduler:
    """``scheduler_cls``: vLLM's own scheduler (async when vLLM turned async
    scheduling on), shifting every request's positions."""

    def __new__(cls, *args: Any, **kwargs: Any):
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler

        vllm_config = kwargs.get("vllm_config", args[0] if args else None)
        base = AsyncScheduler if vllm_config.scheduler_config.async_scheduling else Scheduler
        return _shifting(base)(*args, **kwargs)


def shifted_generation(model: str, prompts: list[list[int]], max_tokens: int,
                       shift: int) -> dict:
    """Greedy outputs of ``prompts`` with the positions of the tokens after
    each prompt shifted by ``shift``, in this process's engine mode; and whether a KV copy through
    ``copy_kv_slots`` on the engine's own caches moves exactly its slots."""
    os.environ[SHIFT_ENV] = str(shift)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import torch
    import vllm

    from vllm_seqhooks.engine import WORKER_EXTENSION_CLASS_PATH
    from vllm_seqhooks.engine.vllm_private import copy_kv_slots, runner_kv_caches
    from tests.support.forkjoin import model_runner_of
    from vllm_seqhooks.scripted.tiny_model import TINY_ENGINE_KWARGS

    llm = vllm.LLM(model=model, scheduler_cls=SCHEDULER_PATH,
                   worker_extension_cls=WORKER_EXTENSION_CLASS_PATH, **TINY_ENGINE_KWARGS)
    params = vllm.SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    layers = runner_kv_caches(model_runner_of(llm))
    caches = [c for c, _ in layers]
    block = TINY_ENGINE_KWARGS["block_size"]
    shapes_ok = len(caches) == 2 and all(c.dim() == 4 and c.shape[2] == block for c in caches)
    src, dst = [3, 4, block + 1], [5 * block + 7, 9 * block, 2]

    def token(cache, elements, slot):
        e = elements[slot % block]
        return cache[slot // block, e[:, 0], e[:, 1], e[:, 2]]

    for c, el in layers:  # known values (unused cache memory may hold NaNs)
        for slot in src:
            e = el[slot % block]
            c[slot // block, e[:, 0], e[:, 1], e[:, 2]] = torch.randn(len(e), dtype=c.dtype)
    before = [c.clone() for c in caches]
    copy_kv_slots(layers, src, dst)
    copied = all(torch.equal(token(c, el, d), token(c, el, s))
                 for c, el in layers for s, d in zip(src, dst))
    untouched = all(
        torch.equal(c[7].view(torch.uint8), b[7].view(torch.uint8))  # bit for bit
        and torch.equal(c[1].view(torch.uint8), b[1].view(torch.uint8))
        for c, b in zip(caches, before))  # blocks 1 and 7: not copied to
    return {"tokens": [list(o.outputs[0].token_ids) for o in outs],
            "kv_views_4d": shapes_ok, "copied": copied, "untouched": untouched,
            "use_v2_model_runner": bool(llm.llm_engine.vllm_config.use_v2_model_runner),
            "async_scheduling": bool(
                llm.llm_engine.vllm_config.scheduler_config.async_scheduling)}
