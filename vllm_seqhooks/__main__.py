"""``python -m vllm_seqhooks``: fork/join decided by a trained model.

Loads the embedded model (``vllm_seqhooks/data/forkjoin_model``, a 2.4M
parameter Llama trained from scratch by ``scripts/train_tiny_forkjoin.py``)
into ``vllm_seqhooks.LLM`` with hooks on, and asks it to sort a few lists of
digits (greedy).  The model itself decides to split a list of more than 4
digits into ``<promise>`` chunks and to ``<sync>``; the engine runs one child
request per chunk and merges the sorted chunks after ``<sync>``; the parent
then writes the merged list.  For each problem it prints the model's text, the
answer, whether it is correct, and the fork/join tree.

``--model vllm_seqhooks/data/threadweaver_model`` runs the same task in
ThreadWeaver's tags (``<Outlines>`` ... ``</Outlines>``, ``<Thread>``).  A
model directory names its format in ``seqhooks.json`` (``"format"``:
``"promise"`` or ``"threadweaver"``); the demo grades it with that format's
task (``vllm_seqhooks.tasks.forkjoin`` or ``vllm_seqhooks.tasks.threadweaver``).

``--scripted`` runs a scripted demo instead: a tiny random-weight model whose
hook tokens are forced by a scripted logits processor.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

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
    from vllm_seqhooks.tasks import cache_dir

    return cache_dir("tiny-model")


@dataclass(frozen=True)
class TrainedFormat:
    """How the demo runs and grades a trained model of one hook format."""

    name: str  # seqhooks.json's "format"
    task: ModuleType  # Problem, check, extract_answer, PARENT_MAX_TOKENS, ENGINE_KWARGS
    #: What the summary line says the model and the engine wrote.
    written: str


def trained_formats() -> dict[str, TrainedFormat]:
    """The formats of the embedded models, by seqhooks.json's ``"format"``."""
    from vllm_seqhooks.tasks import forkjoin, threadweaver

    return {
        "promise": TrainedFormat(
            "promise", forkjoin,
            "every <promise>, </promise> and <sync> above was written by the model "
            "(greedy), the text right after <sync> is the children's merged output"),
        "threadweaver": TrainedFormat(
            "threadweaver", threadweaver,
            f"every {threadweaver.PARALLEL}, {threadweaver.OUTLINES}, {threadweaver.OUTLINE}, "
            f"{threadweaver.OUTLINE_END}, {threadweaver.OUTLINES_END}, "
            f"{threadweaver.CONCLUSION_END} and {threadweaver.PARALLEL_END} above was "
            f"written by the model (greedy); the {threadweaver.THREAD} blocks through "
            f"{threadweaver.CONCLUSION} are the engine's merge of the children's outputs "
            f"(each child wrote its sorted chunk and {threadweaver.THREAD_END})"),
    }


def _supported() -> str:
    return ", ".join(f'"{name}" ({f.task.__name__})' for name, f in trained_formats().items())


def trained_model(model: Path | None) -> tuple[Path, TrainedFormat]:
    """The trained model directory the demo runs (``--model``, or the
    embedded promise model) and its format, read from its ``seqhooks.json``.
    Raises ``SystemExit`` with what to do when the directory holds no
    trained model of a supported format."""
    from vllm_seqhooks.tasks import forkjoin, threadweaver, trained_model_dir

    model = Path(model or forkjoin.model_dir())
    if not (model / "model.safetensors").is_file():
        trained = trained_model_dir(forkjoin.MODEL_DIR.name)
        raise SystemExit(
            f"no trained model in {model} (no model.safetensors). The embedded ones: "
            f"--model {forkjoin.MODEL_DIR} or --model {threadweaver.MODEL_DIR}. Or train "
            f"one: `.venv/bin/python scripts/train_tiny_forkjoin.py` writes {trained} "
            f"(with --task threadweaver: {trained_model_dir(threadweaver.MODEL_DIR.name)}); "
            f"then run `python -m vllm_seqhooks --model {trained}`")
    from vllm_seqhooks.config.presets import FORMAT_KEY, MODEL_FILE, model_settings
    from vllm_seqhooks.config.special_kwargs import SpecialKwargsError

    settings_file = model / MODEL_FILE
    if not settings_file.is_file():
        raise SystemExit(
            f"{settings_file} not found: the demo reads the model's hook format "
            f'from it ("format": one of {_supported()})')
    try:
        name = model_settings(model).get(FORMAT_KEY)
    except SpecialKwargsError as exc:  # (not JSON, not an object)
        raise SystemExit(f"{exc}; the demo grades the formats of its trained tasks: "
                         f"{_supported()}") from None
    formats = trained_formats()
    if name not in formats:
        raise SystemExit(
            f'{settings_file}: "format" is {name!r}; the demo grades the formats of '
            f"its trained tasks: {_supported()}")
    return model, formats[name]


def summary_line(fmt: TrainedFormat, n_ok: int, n: int, elapsed: float) -> str:
    """The demo's last line."""
    return f"{n_ok}/{n} correct in {elapsed:.2f}s; {fmt.written}"


def demo_problems(seed: int, lengths=DEMO_LENGTHS):
    import random

    from vllm_seqhooks.tasks.forkjoin import Problem

    rng = random.Random(seed)
    return [Problem("".join(rng.choice("0123456789") for _ in range(n))) for n in lengths]


def trained_demo(args: argparse.Namespace) -> int:
    model, fmt = trained_model(args.model)
    task = fmt.task
    from vllm import SamplingParams

    from vllm_seqhooks import LLM, format_tree

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
    print(summary_line(fmt, n_ok, len(problems), elapsed))
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
                        help="model directory (default: the embedded trained model "
                             "vllm_seqhooks/data/forkjoin_model; its seqhooks.json names "
                             "its format: promise or threadweaver; with --scripted: where "
                             f"the random model is built, {default_model_dir()})")
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
