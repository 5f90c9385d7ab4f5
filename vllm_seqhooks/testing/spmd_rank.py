"""One rank of an SPMD engine with hooks (vLLM's
``distributed_executor_backend="external_launcher"``, what verl's rollout
workers run): ``torchrun --nproc-per-node 2 -m vllm_seqhooks.testing.spmd_rank
OUT_DIR``. Every rank builds the same engine (tensor parallel over the ranks)
on the embedded fork/join model, generates the same requests, and writes its
answers and traces to ``OUT_DIR/rank-<RANK>.json``; a request with a
per-request timeout is refused on every rank (its error is written too).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

#: More families than slots, so that fair share and the waiting queue decide.
NUM_PROBLEMS = 24


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
    refused = ""
    try:
        timed = SamplingParams(temperature=0, max_tokens=8,
                               extra_args={"seqhooks_family_timeout_s": 5})
        llm.generate([problems[0].prompt], timed, use_tqdm=False)
    except Exception as exc:  # noqa: BLE001 - the error is the result
        refused = f"{type(exc).__name__}: {exc}"
    result = {"answers": [(o.outputs[0].text, o.hook_trace) for o in outs], "refused": refused}
    Path(out_dir, f"rank-{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
