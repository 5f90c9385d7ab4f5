"""One rank of an SPMD engine with hooks (vLLM's
``distributed_executor_backend="external_launcher"``, what verl's rollout
workers run): ``torchrun --nproc-per-node 2 -m tests.support.spmd_rank
OUT_DIR``. Every rank builds the same engine (tensor parallel over the ranks)
on the embedded fork/join model, generates the same requests, and writes its
answers and traces to ``OUT_DIR/rank-<RANK>.json``; then the same again
with per-request timeouts (a child timeout shorter than a step, so that
children time out, and a family timeout), whose deadlines every rank reads
on the ranks' agreed clock (``vllm_seqhooks.engine.agreed_clock``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

#: More families than slots, so that fair share and the waiting queue decide.
NUM_PROBLEMS = 24
#: Families given timeouts: a child timeout, and a family timeout some
#: families may reach. While they run, rank 1 pauses before each step's
#: scheduling (as a rank that detokenizes or logs more would): between a
#: spawn and the next step its clock moves on by more than the child timeout
#: and rank 0's by less, so the ranks decide alike only on an agreed clock.
TIMED_PROBLEMS = 16
CHILD_TIMEOUT_S = 0.03
FAMILY_TIMEOUT_S = 0.5
RANK1_PAUSE_S = 0.06


def main(out_dir: str) -> None:
    from vllm import SamplingParams

    from vllm_seqhooks import LLM
    from vllm_seqhooks.__main__ import demo_problems
    from vllm_seqhooks.tasks import forkjoin as task

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    kwargs = dict(task.ENGINE_KWARGS, max_num_seqs=16)
    llm = LLM(str(task.model_dir()), special_kwargs="auto", **kwargs,
              tensor_parallel_size=world, distributed_executor_backend="external_launcher")
    problems = demo_problems(11, lengths=[3 + (i * 7) % 14 for i in range(NUM_PROBLEMS)])
    params = SamplingParams(temperature=0, max_tokens=task.PARENT_MAX_TOKENS)
    outs = llm.generate([p.prompt for p in problems], params, use_tqdm=False)
    timed_params = [SamplingParams(temperature=0, max_tokens=task.PARENT_MAX_TOKENS,
                                   extra_args={"seqhooks_child_timeout_s": CHILD_TIMEOUT_S})
                    for _ in range(TIMED_PROBLEMS // 2)]
    timed_params += [SamplingParams(temperature=0, max_tokens=task.PARENT_MAX_TOKENS,
                                    extra_args={"seqhooks_family_timeout_s": FAMILY_TIMEOUT_S})
                     for _ in range(TIMED_PROBLEMS - len(timed_params))]
    if rank == 1:
        _pause_before_scheduling(RANK1_PAUSE_S)
    timed = llm.generate([p.prompt for p in problems[:TIMED_PROBLEMS]], timed_params,
                         use_tqdm=False)
    result = {"answers": [(o.outputs[0].text, o.hook_trace) for o in outs],
              "timed": [(o.outputs[0].text, o.hook_trace) for o in timed]}
    Path(out_dir, f"rank-{rank}.json").write_text(json.dumps(result))


def _pause_before_scheduling(seconds: float) -> None:
    import time

    from vllm_seqhooks.engine.scheduler import SeqHooksMixin

    schedule = SeqHooksMixin.schedule

    def paused(self, *args, **kwargs):
        time.sleep(seconds)
        return schedule(self, *args, **kwargs)

    SeqHooksMixin.schedule = paused


if __name__ == "__main__":
    main(sys.argv[1])
