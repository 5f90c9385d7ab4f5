"""``python -m vllm_seqhooks``: fork/join decided by a trained model.

Loads the embedded model (``vllm_seqhooks/data/forkjoin_model``, a 2.4M
parameter Llama trained from scratch by ``scripts/train_tiny_forkjoin.py``)
into ``vllm_seqhooks.LLM`` with hooks on, and asks it to sort a few lists of
digits (greedy).  The model itself decides to split a list of more than 4
digits into ``<promise>`` chunks and to ``<sync>``; the engine runs one child
request per chunk and merges the sorted chunks after ``<sync>``; the parent
then writes the merged list.  For each problem it prints the model's text, the
answer, whether it is correct, and the fork/join tree.

``--scripted`` runs a scripted demo instead: a tiny random-weight model whose
hook tokens are forced by a scripted logits processor.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

DEMOS = [
    # (prompt, parent script, child scripts) for --scripted
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

#: Lengths of the default demo problems (0, 2, 3 and 4 promises).
DEMO_LENGTHS = (3, 7, 10, 13, 16)


def default_model_dir() -> Path:
    """Where ``--scripted`` builds the tiny random model."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "vllm-seqhooks" / "tiny-model"


def demo_problems(seed: int, lengths=DEMO_LENGTHS):
    import random

    from vllm_seqhooks.tasks.forkjoin import Problem

    rng = random.Random(seed)
    return [Problem("".join(rng.choice("0123456789") for _ in range(n))) for n in lengths]


def trained_demo(args: argparse.Namespace) -> int:
    from vllm import SamplingParams

    from vllm_seqhooks import LLM, format_tree
    from vllm_seqhooks.tasks import forkjoin as task

    model = Path(args.model or task.model_dir())
    if not (model / "model.safetensors").is_file():
        raise SystemExit(
            f"no trained model in {model}; train it with "
            "`.venv/bin/python scripts/train_tiny_forkjoin.py`")
    if args.digits:
        problems = [task.Problem(d) for d in args.digits]
    else:
        problems = demo_problems(args.seed)
    # The model carries its hook settings (seqhooks.json beside config.json).
    llm = LLM(str(model), special_kwargs="auto", **task.ENGINE_KWARGS)
    params = SamplingParams(temperature=0.0, max_tokens=task.PARENT_MAX_TOKENS)
    t0 = time.perf_counter()
    try:
        outputs = llm.generate([p.prompt for p in problems], params, use_tqdm=False)
        elapsed = time.perf_counter() - t0
    finally:
        llm.shutdown()
    n_ok = 0
    for p, out in zip(problems, outputs):
        text = out.outputs[0].text
        ok = task.check(p, text)
        n_ok += ok
        print("=" * 78)
        print(f"prompt   : {p.prompt}")
        print(f"model    : {text}")
        print(f"answer   : {task.extract_answer(text)}   "
              f"({'correct' if ok else 'WRONG, expected ' + p.answer})")
        print(format_tree(out.hook_trace))
    print("=" * 78)
    print(f"{n_ok}/{len(problems)} correct in {elapsed:.2f}s; every <promise>, </promise> "
          f"and <sync> above was written by the model (greedy), the text right after "
          f"<sync> is the children's merged output")
    return 0 if n_ok == len(problems) else 1


def scripted_demo(args: argparse.Namespace) -> int:
    from vllm_seqhooks import format_tree
    from vllm_seqhooks.scripted.llm import Scripts, hook_llm
    from vllm_seqhooks.scripted.tiny_model import build_tiny_model

    model = str(build_tiny_model(args.model or default_model_dir()))
    llm = hook_llm(model, hooks=dict(max_child_depth=2, merge_separator="; "))
    S = Scripts(llm.get_tokenizer())
    t0 = time.perf_counter()
    try:
        outputs = llm.generate([p for p, _, _ in DEMOS],
                               [S.params(s, c) for _, s, c in DEMOS], use_tqdm=False)
        elapsed = time.perf_counter() - t0
    finally:
        llm.shutdown()
    for (prompt, _, _), out in zip(DEMOS, outputs):
        print("=" * 72)
        print(f"prompt : {prompt!r}")
        print(f"output : {out.outputs[0].text!r}")
        print(format_tree(out.hook_trace))
    print("=" * 72)
    print(f"{len(outputs)} requests with fork/join in {elapsed:.2f}s "
          f"(hook tokens forced by a script: the tiny model has random weights)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_seqhooks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("digits", nargs="*",
                        help="lists of digits to sort (default: five random ones)")
    parser.add_argument("--seed", type=int, default=7,
                        help="seed of the default problems (default: %(default)s)")
    parser.add_argument("--model", "--model-dir", dest="model", type=Path, default=None,
                        help="model directory (default: the embedded trained model; "
                             "with --scripted: where the random model is built, "
                             f"{default_model_dir()})")
    parser.add_argument("--scripted", action="store_true",
                        help="the scripted-token demo on a random model")
    parser.add_argument("--verbose", action="store_true", help="keep vLLM's INFO logs")
    args = parser.parse_args(argv)
    if not args.verbose:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    for d in args.digits:
        if not d.isdigit():
            parser.error(f"not a list of digits: {d!r}")
    if args.scripted:
        return scripted_demo(args)
    return trained_demo(args)


if __name__ == "__main__":
    raise SystemExit(main())
