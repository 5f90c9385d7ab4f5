"""``python -m vllm_seqhooks``: fork/join on the embedded tiny model.

Builds the tiny random-weight model offline (cached), starts
``vllm_seqhooks.LLM`` with hooks on, and runs a few requests whose hook
tokens are forced by the scripted-token logits processor (a random model
does not write them by itself). Prints each parent's text with the merged
child outputs, and its fork/join tree.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

DEMOS = [
    # (prompt, parent script, child scripts)
    (
        "Plan a trip:",
        "Split it.<promise>flights</promise><promise>hotel</promise><sync> Booked.",
        {"0": "Flight AB12 at 9:00", "1": "Hotel Rose, 2 nights"},
    ),
    (
        "Sum 12+30+7:",
        "<promise>12+30</promise><promise>+7</promise><sync>=49",
        {"0": "42", "1": "7"},
    ),
    (
        "Nested:",
        "<promise>outer</promise><sync>.",
        {"0": "A<promise>inner</promise><sync>C", "0.0": "B"},
    ),
]


def default_model_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "vllm-seqhooks" / "tiny-model"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_seqhooks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=default_model_dir(),
                        help="where the tiny model is built (default: %(default)s)")
    parser.add_argument("--verbose", action="store_true", help="keep vLLM's INFO logs")
    args = parser.parse_args(argv)
    if not args.verbose:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

    from vllm_seqhooks import format_tree
    from vllm_seqhooks.testing.forkjoin import Scripts, hook_llm
    from vllm_seqhooks.testing.tiny_model import build_tiny_model

    model = str(build_tiny_model(args.model_dir))
    llm = hook_llm(model, hooks=dict(max_child_depth=2, merge_separator="; "))
    S = Scripts(llm.get_tokenizer())
    t0 = time.perf_counter()
    outputs = llm.generate([p for p, _, _ in DEMOS],
                           [S.params(s, c) for _, s, c in DEMOS], use_tqdm=False)
    elapsed = time.perf_counter() - t0
    for (prompt, _, _), out in zip(DEMOS, outputs):
        print("=" * 72)
        print(f"prompt : {prompt!r}")
        print(f"output : {out.outputs[0].text!r}")
        print(format_tree(out.hook_trace))
    print("=" * 72)
    print(f"{len(outputs)} requests with fork/join in {elapsed:.2f}s "
          f"(hook tokens forced by a script: the tiny model has random weights)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
