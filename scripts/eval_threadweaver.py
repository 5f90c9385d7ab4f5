#!/usr/bin/env python
"""Evaluate the embedded ThreadWeaver-format model (``vllm_seqhooks.tasks.threadweaver``) on
held-out problems, three ways, greedy, float32:

- ``serve``: ``vllm serve MODEL --seqhooks auto`` (the settings the model
  carries in ``seqhooks.json``), 8 concurrent clients with the ``openai``
  package on ``/v1/completions``;
- ``native``: ``vllm_seqhooks.LLM(MODEL, special_kwargs="auto")``, in process,
  all problems in one batch;
- ``loop``: the format's own client loop
  (:class:`vllm_seqhooks.loops.format_loop.FormatLoop`) over a stock ``vllm.LLM``
  with the same ``"auto"`` settings.

Reports accuracy for each, and how many problems give identical output
token ids natively and through the loop (and through the server).  Each
side runs in its own subprocess.  Writes ``threadweaver_eval.json`` into
``--out DIR``: by default a user cache,
``${XDG_CACHE_HOME:-~/.cache}/vllm-seqhooks/eval``; the shipped
``docs/threadweaver_eval.json`` changes only with ``--out docs``.

    .venv/bin/python scripts/eval_threadweaver.py              # 1000 held-out problems
    .venv/bin/python scripts/eval_threadweaver.py --out docs   # the same, and update docs/
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from vllm_seqhooks.tasks import threadweaver as task  # noqa: E402


def _params():
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=task.PARENT_MAX_TOKENS)


def run_native(model: str, problems) -> list[dict]:
    from vllm_seqhooks import LLM

    llm = LLM(model, special_kwargs="auto", **task.ENGINE_KWARGS)
    outs = llm.generate([p.prompt for p in problems], _params(), use_tqdm=False)
    recs = []
    for out in outs:
        c = out.outputs[0]
        trace = out.hook_trace or {}
        recs.append({"prompt_token_ids": list(out.prompt_token_ids),
                     "token_ids": list(c.token_ids), "text": c.text,
                     "finish_reason": c.finish_reason,
                     "children": len(trace.get("children", [])),
                     "joins": len(trace.get("joins", []))})
    return recs


def run_loop(model: str, problems) -> list[dict]:
    import vllm

    from vllm_seqhooks.loops.format_loop import FormatLoop

    loop = FormatLoop(vllm.LLM(model, **task.ENGINE_KWARGS), "auto")
    results = loop.generate([p.prompt for p in problems], _params())
    return [{"prompt_token_ids": list(r.prompt_token_ids), "token_ids": list(r.token_ids),
             "text": r.text, "finish_reason": r.finish_reason, "children": len(r.children),
             "joins": len(r.joins)} for r in results]


def serve_completions(url: str, model: str, problems, workers: int = 8) -> list[dict]:
    """Greedy completions of ``problems`` from a running server."""
    from concurrent.futures import ThreadPoolExecutor

    from openai import OpenAI

    client = OpenAI(base_url=url + "/v1", api_key="unused", timeout=300)

    def one(p):
        choice = client.completions.create(
            model=model, prompt=p.prompt, max_tokens=task.PARENT_MAX_TOKENS, temperature=0,
            extra_body={"return_token_ids": True}).choices[0]
        return {"token_ids": list((choice.model_extra or {}).get("token_ids") or []),
                "text": choice.text, "finish_reason": choice.finish_reason}

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, problems))


def run_serve(model: str, problems) -> list[dict]:
    from vllm_seqhooks.check import trained_engine_flags
    from tests.support.server import start_server

    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(model, "--seqhooks", "auto", *trained_engine_flags(),
                              log_path=Path(tmp) / "serve.log")
        try:
            return serve_completions(server.url, model, problems)
        finally:
            server.stop()


SIDES = {"native": run_native, "loop": run_loop, "serve": run_serve}


def side_main(args) -> int:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    problems = task.heldout_problems(args.n, args.seed)
    t0 = time.perf_counter()
    recs = SIDES[args.side](str(args.model), problems)
    seconds = time.perf_counter() - t0
    Path(args.dump).write_text(json.dumps({"records": recs, "seconds": seconds}))
    return 0


def default_out_dir() -> Path:
    """Where the results go without ``--out``."""
    from vllm_seqhooks.tasks import cache_dir

    return cache_dir("eval")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=task.model_dir())
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=task.HELDOUT_SEED)
    ap.add_argument("--sides", default="serve,native,loop")
    ap.add_argument("--out", type=Path, default=None,
                    help=f"directory for threadweaver_eval.json (default: {default_out_dir()}; "
                         "the shipped docs/threadweaver_eval.json changes only with --out docs)")
    ap.add_argument("--json", type=Path, default=None,
                    help="the results file (default: --out's threadweaver_eval.json)")
    ap.add_argument("--side", choices=sorted(SIDES), help=argparse.SUPPRESS)
    ap.add_argument("--dump", help=argparse.SUPPRESS)
    return ap


def output_path(args: argparse.Namespace) -> Path:
    """The JSON the run writes (``--json``, else in ``--out``, else in the
    user cache: never docs/ by default)."""
    if args.json is not None:
        return args.json
    return (args.out if args.out is not None else default_out_dir()) / "threadweaver_eval.json"


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.side:
        return side_main(args)
    args.json = output_path(args)

    problems = task.heldout_problems(args.n, args.seed)
    sides = [s for s in args.sides.split(",") if s]
    runs: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for side in sides:
            dump = Path(tmp) / f"{side}.json"
            print(f"{side}: {args.n} problems ...", flush=True)
            t0 = time.perf_counter()
            subprocess.run([sys.executable, str(Path(__file__).resolve()), "--side", side,
                            "--dump", str(dump), "--n", str(args.n), "--seed", str(args.seed),
                            "--model", str(args.model)], check=True)
            runs[side] = json.loads(dump.read_text())
            runs[side]["process_seconds"] = time.perf_counter() - t0
    results: dict[str, dict] = {}
    for side, run in runs.items():
        texts = [r["text"] for r in run["records"]]
        s = task.summarize(problems, texts)
        s["seconds"] = round(run["seconds"], 2)
        s["finish_reasons"] = {}
        for r in run["records"]:
            s["finish_reasons"][r["finish_reason"]] = s["finish_reasons"].get(
                r["finish_reason"], 0) + 1
        if "children" in run["records"][0]:
            s["children"] = sum(r["children"] for r in run["records"])
        s["wrong"] = [{"digits": p.digits, "text": t} for p, t in zip(problems, texts)
                      if not task.check(p, t)][:20]
        results[side] = s

    def identical(a: str, b: str) -> dict:
        ra, rb = runs[a]["records"], runs[b]["records"]
        same = [x["token_ids"] == y["token_ids"] for x, y in zip(ra, rb)]
        same_text = [x["text"] == y["text"] for x, y in zip(ra, rb)]
        return {"n": len(same), "identical_token_ids": sum(same),
                "identical_text": sum(same_text),
                "differ": [p.digits for p, ok in zip(problems, same) if not ok][:20]}

    agreement = {f"{a}_vs_{b}": identical(a, b)
                 for a, b in (("native", "loop"), ("serve", "native"), ("serve", "loop"))
                 if a in runs and b in runs}
    if "native" in runs and "loop" in runs:
        agreement["native_vs_loop"]["identical_prompt_token_ids"] = sum(
            x["prompt_token_ids"] == y["prompt_token_ids"]
            for x, y in zip(runs["native"]["records"], runs["loop"]["records"]))
    import torch
    import vllm

    from benchmarks.common import cpu_model, git_commit

    training = {}
    tj = Path(args.model) / "training.json"
    if tj.is_file():
        training = {k: v for k, v in json.loads(tj.read_text()).items() if k != "history"}
    out = {
        "command": "python scripts/eval_threadweaver.py " + " ".join(
            argv if argv is not None else sys.argv[1:]),
        "n": args.n, "seed": args.seed, "parent_max_tokens": task.PARENT_MAX_TOKENS,
        "settings": json.loads((Path(args.model) / "seqhooks.json").read_text()),
        "results": results, "agreement": agreement,
        "info": {"torch": torch.__version__, "vllm": vllm.__version__,
                 "date": datetime.datetime.now(datetime.timezone.utc).strftime(
                     "%Y-%m-%d %H:%M UTC"),
                 "commit": git_commit(("vllm_seqhooks",)) or "?",
                 "machine": f"{os.cpu_count()}-core CPU ({cpu_model()}), no GPU",
                 "training": training},
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({"results": {k: {m: v[m] for m in ("correct", "n", "full_text_exact")}
                                  for k, v in results.items()},
                      "agreement": agreement}, indent=2))
    print(f"wrote {args.json}")
    ok = all(v["identical_token_ids"] == v["n"] for v in agreement.values())
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
