"""A known background load: another vLLM engine generating beside the tests.

``python -m tests.support.background_load --minutes N`` starts a stock vLLM
engine on the tiny model (vllm_seqhooks/scripted/tiny_model.py, built under
``--model-dir``) and generates batches of sampled tokens without pause until
N minutes have passed, then exits by itself (the deadline is checked between
batches; a batch takes about a second). ``scripts/test.sh`` starts it for
the run's first N minutes when ``SEQHOOKS_TEST_BACKGROUND_LOAD=N`` is set
(docs/testing.md, "Under load").

It keeps the machine's CPUs busy the way the failures of issue 51 item 6
were seen (a second engine's OpenMP threads on the same cores); it is not a
benchmark and checks nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.background_load")
    parser.add_argument("--minutes", type=float, required=True,
                        help="stop after this many minutes")
    parser.add_argument("--batch", type=int, default=32, help="prompts per batch")
    parser.add_argument("--tokens", type=int, default=128, help="tokens per prompt")
    parser.add_argument("--model-dir", default=str(Path(tempfile.gettempdir())
                                                   / "seqhooks-background-load-model"))
    args = parser.parse_args(argv)
    deadline = time.monotonic() + 60 * args.minutes

    # In process: the engine ends with this process, nothing to shut down.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import vllm

    from vllm_seqhooks.scripted.tiny_model import TINY_ENGINE_KWARGS, build_tiny_model

    model = str(build_tiny_model(args.model_dir))
    llm = vllm.LLM(model, **TINY_ENGINE_KWARGS)
    params = vllm.SamplingParams(max_tokens=args.tokens, ignore_eos=True, temperature=1.0)
    batches = tokens = 0
    print(f"background_load: generating until {args.minutes:g} min have passed "
          f"(pid {os.getpid()})", file=sys.stderr, flush=True)
    while time.monotonic() < deadline:
        prompts = [f"Q{batches}-{i}: " for i in range(args.batch)]
        outs = llm.generate(prompts, params, use_tqdm=False)
        tokens += sum(len(o.outputs[0].token_ids) for o in outs)
        batches += 1
    print(f"background_load: done, {batches} batches, {tokens} tokens generated",
          file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
