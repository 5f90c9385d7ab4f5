#!/usr/bin/env python
"""Evaluate the embedded fork/join model on a held-out set, two ways:

- native: ``vllm_seqhooks.LLM`` with hooks on (fork/join in the engine);
- client loop: the same model on a stock ``vllm.LLM`` (prefix caching on),
  driven by :class:`vllm_seqhooks.loops.promise_loop.ClientLoop`.

Greedy decoding, float32: both must give the same tokens for every problem;
any mismatch is reported.  For each: accuracy (exact match of the sorted
list), wall-clock (all problems in one batch, best of ``--rounds`` engine
processes per side x ``--repeats`` runs; and one
request at a time on the first ``--latency-n`` problems), and prompt tokens
prefilled (computed, i.e. not served by the prefix cache: native = parent
prompts + tokens prefilled at joins + children's prompts; client loop = every
submitted prompt of every round + children's prompts).  Writes the page
``forkjoin_model.md`` and the raw numbers ``forkjoin_eval.json`` into
``--out DIR``: by default a user cache,
``${XDG_CACHE_HOME:-~/.cache}/vllm-seqhooks/eval``; the shipped
``docs/forkjoin_model.md`` and ``docs/forkjoin_eval.json`` change only with
``--out docs``.

Each side runs in its own subprocess (one engine alive at a time).

    .venv/bin/python scripts/eval_forkjoin.py              # 1000 held-out problems
    .venv/bin/python scripts/eval_forkjoin.py --out docs   # the same, and update docs/
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import cpu_model, git_commit  # noqa: E402
from vllm_seqhooks.tasks import forkjoin as task  # noqa: E402

WARMUP_SEED = 99


# --------------------------------------------------------------------------
# One side (runs in a subprocess)
# --------------------------------------------------------------------------


def _native_records(problems, outputs):
    recs = []
    for p, out in zip(problems, outputs):
        c = out.outputs[0]
        trace = out.hook_trace or {}
        children = trace.get("children", [])
        joins = trace.get("joins", [])
        merged = sum(j["merged_tokens"] for j in joins)
        recs.append({
            "digits": p.digits,
            "prompt_token_ids": list(out.prompt_token_ids),
            "token_ids": list(c.token_ids),
            "text": c.text,
            "finish_reason": c.finish_reason,
            "children": len(children),
            "child_outputs": [ch.get("output") for ch in children],
            "parent_prefilled": len(out.prompt_token_ids) - int(out.num_cached_tokens or 0)
            + sum(j["prefilled_tokens"] for j in joins),
            "child_prefilled": sum(ch["prompt_tokens"] - ch["cached_prompt_tokens"]
                                   for ch in children),
            "parent_sampled": len(c.token_ids) - merged,
            # Tokens the children sampled (their EOS included).
            "child_sampled": sum(ch["sampled_tokens"] if ch.get("sampled_tokens") is not None
                                 else ch["num_output_tokens"] + 1 for ch in children),
            "rounds": 1 + len(joins),
        })
    return recs


def _loop_records(problems, results):
    recs = []
    for p, r in zip(problems, results):
        recs.append({
            "digits": p.digits,
            "prompt_token_ids": list(r.prompt_token_ids),
            "token_ids": list(r.token_ids),
            "text": r.text,
            "finish_reason": r.finish_reason,
            "children": len(r.children),
            "child_outputs": None,
            "parent_prefilled": r.parent_prefilled_tokens,
            "child_prefilled": r.child_prefilled_tokens,
            "parent_sampled": r.sampled_tokens,
            "child_sampled": sum(len(c.output_token_ids) for c in r.children),
            "rounds": r.rounds,
        })
    return recs


def run_side(side: str, args) -> dict:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from vllm import SamplingParams

    problems = task.heldout_problems(args.n, args.seed)
    warm = task.generate_problems(16, WARMUP_SEED)
    params = SamplingParams(temperature=0.0, max_tokens=task.PARENT_MAX_TOKENS)
    model = str(args.model)
    engine_kwargs = dict(task.ENGINE_KWARGS, kv_cache_memory_bytes=args.kv_mib << 20)
    if side == "native":
        from vllm_seqhooks import LLM

        llm = LLM(model, special_kwargs=task.hook_settings(), **engine_kwargs)

        def run(ps):
            outs = llm.generate([p.prompt for p in ps], params, use_tqdm=False)
            return _native_records(ps, outs)
    else:
        import vllm

        from vllm_seqhooks.loops.promise_loop import ClientLoop

        llm = vllm.LLM(model, **engine_kwargs)
        loop = ClientLoop(llm, task.hook_settings())

        def run(ps):
            return _loop_records(ps, loop.generate([p.prompt for p in ps], params))

    run(warm)
    batch_times = []
    records = None
    for _ in range(args.repeats):
        llm.reset_prefix_cache()
        t0 = time.perf_counter()
        recs = run(problems)
        batch_times.append(time.perf_counter() - t0)
        if records is not None and [r["token_ids"] for r in recs] != [
                r["token_ids"] for r in records]:
            raise RuntimeError(f"{side}: repeated runs differ")
        records = recs
    llm.reset_prefix_cache()
    lat = []
    for p in problems[: args.latency_n]:
        t0 = time.perf_counter()
        run([p])
        lat.append(time.perf_counter() - t0)
    return {"side": side, "records": records, "batch_seconds": batch_times,
            "latency_seconds": lat}


# --------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------


def summarize(res: dict) -> dict:
    recs = res["records"]
    problems = [task.Problem(r["digits"]) for r in recs]
    s = task.summarize(problems, [r["text"] for r in recs])
    s.update({
        "batch_seconds": min(res["batch_seconds"]),
        "batch_seconds_all": [round(t, 3) for t in res["batch_seconds"]],
        "latency_mean_ms": 1000 * sum(res["latency_seconds"]) / max(1, len(res["latency_seconds"])),
        "latency_n": len(res["latency_seconds"]),
        "parent_prefilled": sum(r["parent_prefilled"] for r in recs),
        "child_prefilled": sum(r["child_prefilled"] for r in recs),
        "parent_sampled": sum(r["parent_sampled"] for r in recs),
        "child_sampled": sum(r["child_sampled"] for r in recs),
        "children": sum(r["children"] for r in recs),
        "rounds_max": max(r["rounds"] for r in recs),
    })
    s["prefilled"] = s["parent_prefilled"] + s["child_prefilled"]
    by_k: dict[int, list[int]] = {}
    for p, r in zip(problems, recs):
        by_k.setdefault(len(p.chunks), [0, 0])
        by_k[len(p.chunks)][0] += task.check(p, r["text"])
        by_k[len(p.chunks)][1] += 1
    s["by_promises"] = {k: v for k, v in sorted(by_k.items())}
    return s


def _before_out(command: str | None, shipped: str) -> str:
    """A note for a recorded command run when the script's default output
    was the shipped place (before ``--out`` had to name it)."""
    if not command or "--out" in command.split():
        return ""
    return f"; it wrote to `{shipped}`, which today takes `--out {shipped}`"


def machine() -> str:
    return f"{os.cpu_count()}-core CPU ({cpu_model()}), no GPU"


def pressure_section(pressure: dict, native: dict, loop: dict, args) -> str:
    if not pressure:
        return ""
    np_, lp_ = pressure.get("native_pressure"), pressure.get("loop_pressure")
    return f"""
### Under KV-cache pressure

The same {args.n} problems in one batch with a {args.pressure_kv_mib} MiB KV cache
({args.pressure_kv_mib * 8} blocks of 32 tokens; each parent holds about two
while parked, and with the first version of the scheduler up to 743 were
parked at once). Same tokens, same accuracy
({np_['correct']} / {lp_['correct']} correct):

| wall clock, all {args.n} in one batch (best of {args.rounds} x {args.repeats}) | native | client loop |
| --- | --- | --- |
| KV cache {args.kv_mib} MiB | {native['batch_seconds']:.2f} s | {loop['batch_seconds']:.2f} s |
| KV cache {args.pressure_kv_mib} MiB | {np_['batch_seconds']:.2f} s | {lp_['batch_seconds']:.2f} s |

Parked parents keep their KV blocks while their children run; the client
loop's parents give theirs back at `<sync>` (the blocks stay in the prefix
cache). A first version of the scheduler queued children FCFS behind the
parents not yet admitted: with the small cache, new parents kept getting the
freed blocks and parked, and the children ran a few at a time (a diagnostic
in-process run on 2026-11-22 counted 1,304 engine steps natively, about 1,100
of them scheduling only 1 to 3 requests while up to 743 parents were parked;
the loop took 158 steps, 512 MiB natively 143). Children are now admitted
before requests that have not started (they queue at their parent's place),
and the same diagnostic counts 156 engine steps natively at 128 MiB (as many
as at 512 MiB). The table above is from this version.
"""


def write_doc(path: Path, info: dict, native: dict, loop: dict, mismatches: list,
              args, command: str, pressure: dict, wrong: list) -> None:
    tr = info.get("training", {})
    v = tr.get("validation", {})
    def pct(x):
        return f"{100 * x:.1f} %"
    wrong_lines = "\n".join(
        f"- `{task.prompt_text(w['digits'])}` → `{w['text']}` (expected `{task.solve(w['digits'])}`)"
        for w in wrong) or "- none"
    rows_k = "\n".join(
        f"| {k} | {n_tot} | {native['by_promises'][k][0]} | {loop['by_promises'][k][0]} |"
        for k, (_, n_tot) in native["by_promises"].items())
    doc = f"""# The embedded fork/join model

`python -m vllm_seqhooks` runs a small model trained from scratch to use
sequence hooks by itself: it decides when to write `<promise>` … `</promise>`
and `<sync>`; the engine runs the children and merges their outputs. This page
describes the task, the training, and the evaluation (generated by
`scripts/eval_forkjoin.py`; raw numbers in `docs/forkjoin_eval.json`).

## Task: sorting digits by one level of merge sort

`vllm_seqhooks/tasks/forkjoin.py` (generator, exact checker). A problem is a
list of 1 to {task.MAX_LEN} random digits (length uniform). Lists of at most
{task.CHUNK} digits are sorted directly; longer lists are cut into consecutive
chunks of {task.CHUNK} (the last may be shorter), one promise per chunk:

```
sort 391=139</s>
sort 3917425=<promise>3917</promise><promise>425</promise><sync>1379,245=1234579</s>
                                                                ^^^^^^^^ merged by the engine
```

- Children run in **`payload` context** with the template
  `{task.CHILD_PROMPT_TEMPLATE}`: a child is the same task on a short list
  (`sort 3917=` → `1379</s>`), so one model plays both roles, and children
  need nothing of the parent's context. Merge separator `{task.MERGE_SEPARATOR}`;
  `child_max_tokens={task.CHILD_MAX_TOKENS}`; parent `max_tokens={task.PARENT_MAX_TOKENS}`.
- These settings travel with the model, in
  `vllm_seqhooks/data/forkjoin_model/seqhooks.json`:
  `LLM(model_dir, special_kwargs="auto")` and
  `vllm serve vllm_seqhooks/data/forkjoin_model --seqhooks auto` need no
  other hook setting (with the README's `<promise>`/`<sync>` flags alone,
  children would run in `fork` context and answer wrongly).
- The number of promises (0, 2, 3 or 4) depends on the length, so the model
  must decide whether and how often to fork, copy each chunk into its payload,
  and after the join merge the sorted chunks it is given.
- Checker: the text after the last `=` of the output must equal the sorted
  digits (`check`). Also reported: `check_full_text` (the whole output is
  exactly the expected fork/join text) and whether the payloads are exactly
  the chunks.
- Why this task: it decomposes into independent sub-tasks of the same kind,
  the fan-out varies with the input, sequences are short (at most 85 tokens),
  and a 2.4M-parameter model learns it to near-perfect accuracy in minutes on
  a CPU.

## Model and training

`scripts/train_tiny_forkjoin.py` (plain PyTorch + transformers
`LlamaForCausalLM`, from scratch):

- Llama, hidden 256, 4 layers, 4 attention heads of 64, 2 KV heads,
  MLP 512, vocabulary 128 (the character-level tokenizer of
  `vllm_seqhooks/scripted/tiny_model.py`: `<promise>`=4, `</promise>`=5,
  `<sync>`=6, EOS `</s>`=2, BOS `<s>`=1); {tr.get('parameters', 0):,} parameters,
  saved as {tr.get('saved_dtype', '?')} safetensors (`vllm_seqhooks/data/forkjoin_model/`,
  with `training.json`).
- Data: an endless seeded stream; each batch mixes parent sequences (BOS,
  prompt, the parent's output with the merged text, EOS) and, for
  {pct(tr.get('child_frac', 0))} of the rows, child sequences as the engine builds them
  (no BOS). Teacher forcing; the loss covers only tokens the request samples
  itself (not the prompt, not the merged tokens after `<sync>`).
- AdamW (lr {tr.get('lr')}, warm-up {tr.get('warmup')} steps, cosine decay, weight decay
  {tr.get('weight_decay')}), batch {tr.get('batch_size')}, {tr.get('steps')} steps, seed {tr.get('seed')}.
- Command: `{tr.get('command')}` ({tr.get('threads')} thread(s); the checkpoint options do not change the run{_before_out(tr.get('command'), 'vllm_seqhooks/data/forkjoin_model')}):
  **{tr.get('train_seconds', 0) / 60:.1f} min** wall time on this machine (shared with other jobs),
  final training loss {tr.get('final_loss_ema')} (moving average).
  Deterministic: same seed and thread count give identical weights (a second
  run of the command reproduced the shipped `model.safetensors` bit for bit;
  float reductions differ with the thread count, so `--threads 2` gives
  other weights, not checked here).
- Validation during training (teacher forced, exact for greedy decoding: all
  argmaxes of a parent and its children right): {pct(v.get('greedy_exact_teacher_forced', 0))} of
  {v.get('n')} problems (float32 weights), {pct(v.get('greedy_exact_teacher_forced_saved_weights', 0))}
  with the saved weights.

## Held-out evaluation

{args.n} problems from `heldout_problems(seed={args.seed})` (a seed used by no
training stream), greedy, float32, engine arguments `tasks.forkjoin.ENGINE_KWARGS`
(block size 32, prefix caching on, `enforce_eager`, default `max_num_seqs` 256,
default multiprocess engine) with a {args.kv_mib} MiB KV cache
({args.kv_mib * 8} blocks of 32 tokens for this model: the whole batch fits).
Both sides warm up on 16 other problems first; the prefix cache is reset
before each timed run.

| | native fork/join (`vllm_seqhooks.LLM`) | client loop over stock `vllm.LLM` |
| --- | --- | --- |
| accuracy (answer exact) | **{native['correct']}/{native['n']} = {pct(native['accuracy'])}** | **{loop['correct']}/{loop['n']} = {pct(loop['accuracy'])}** |
| whole output text as expected | {native['full_text_exact']} | {loop['full_text_exact']} |
| payloads = the expected chunks | {native['decomposition_correct']} | {loop['decomposition_correct']} |
| children spawned | {native['children']} | {loop['children']} |
| wall clock, all {args.n} in one batch (best of {args.rounds} x {args.repeats}) | {native['batch_seconds']:.2f} s | {loop['batch_seconds']:.2f} s |
| wall clock, one request at a time (mean of {native['latency_n']}, best of {args.rounds}) | {native['latency_mean_ms']:.1f} ms | {loop['latency_mean_ms']:.1f} ms |
| prompt tokens prefilled, parents | {native['parent_prefilled']:,} | {loop['parent_prefilled']:,} |
| prompt tokens prefilled, children | {native['child_prefilled']:,} | {loop['child_prefilled']:,} |
| prompt tokens prefilled, total | **{native['prefilled']:,}** | **{loop['prefilled']:,}** |
| tokens sampled, parents / children | {native['parent_sampled']:,} / {native['child_sampled']:,} | {loop['parent_sampled']:,} / {loop['child_sampled']:,} |
| rounds (generate calls per parent), max | {native['rounds_max']} (1 + joins) | {loop['rounds_max']} |

**Agreement:** {args.n - len({m['digits'] for m in mismatches})}/{args.n} problems give identical output token ids
(and text) natively and through the client loop, in every run of this page
(each side ran in {args.rounds} engine processes per KV-cache size){'' if not mismatches else '; mismatches: ' + ', '.join(m['digits'] for m in mismatches[:10])}.

Accuracy by number of promises the task calls for:

| promises | problems | native correct | client loop correct |
| --- | --- | --- | --- |
{rows_k}

Wrong answers (native; the client loop's are the same):

{wrong_lines}
{pressure_section(pressure, native, loop, args)}
Prefilled tokens: native counts each parent's prompt (minus prefix-cache
hits), the tokens computed when it resumes after a join (`<sync>` and the
merged tokens; `joins[].prefilled_tokens` in the trace) and the children's
prompts; the client loop counts every prompt it submits (minus
`RequestOutput.num_cached_tokens`): the parent's first prompt, its re-submission
after the join (the whole context again, of which only full 32-token blocks
come from the prefix cache) and the children's prompts. Wall-clock times were
taken on a machine shared with other jobs and vary by ±20 % between runs.

Machine: {info.get('machine') or machine()}; torch {info['torch']}, vLLM {info['vllm']}; {info['date']}, commit {info.get('commit', '?')}.
Command: `{command}`{_before_out(command, 'docs')}.
"""
    path.write_text(doc)


def default_out_dir() -> Path:
    """Where the page and its numbers go without ``--out``."""
    from vllm_seqhooks.tasks import cache_dir

    return cache_dir("eval")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=task.HELDOUT_SEED)
    ap.add_argument("--model", type=Path, default=task.model_dir())
    ap.add_argument("--repeats", type=int, default=2,
                    help="timed batch runs per engine process")
    ap.add_argument("--rounds", type=int, default=2,
                    help="engine processes per side and setting (alternating sides)")
    ap.add_argument("--latency-n", type=int, default=50)
    ap.add_argument("--kv-mib", type=int, default=512,
                    help="KV cache of the main runs (MiB): the whole batch fits")
    ap.add_argument("--pressure-kv-mib", type=int, default=128,
                    help="KV cache of the extra batch-timing runs under KV "
                         "pressure (MiB; 0: skip them)")
    ap.add_argument("--out", type=Path, default=None,
                    help=f"directory for forkjoin_model.md and forkjoin_eval.json (default: "
                         f"{default_out_dir()}; the shipped pages change only with "
                         "--out docs)")
    ap.add_argument("--doc", type=Path, default=None,
                    help="the page (default: --out's forkjoin_model.md)")
    ap.add_argument("--json", type=Path, default=None,
                    help="the raw numbers (default: --out's forkjoin_eval.json)")
    ap.add_argument("--doc-only", action="store_true",
                    help="only rewrite --doc from the results in --json")
    ap.add_argument("--side", choices=("native", "loop"), help=argparse.SUPPRESS)
    ap.add_argument("--dump", type=Path, help=argparse.SUPPRESS)
    return ap


def output_paths(args: argparse.Namespace) -> tuple[Path, Path]:
    """The page and the JSON the run writes (``--doc``, ``--json``, else in
    ``--out``, else in the user cache: never docs/ by default)."""
    out = args.out if args.out is not None else default_out_dir()
    return (args.doc if args.doc is not None else out / "forkjoin_model.md",
            args.json if args.json is not None else out / "forkjoin_eval.json")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)

    if args.side:
        res = run_side(args.side, args)
        args.dump.write_text(json.dumps(res))
        return 0
    args.doc, args.json = output_paths(args)
    if args.doc_only:
        out = json.loads(args.json.read_text())
        for k in ("n", "seed", "kv_mib", "pressure_kv_mib", "rounds", "repeats"):
            setattr(args, k, out[k])
        pressure = {k: out[k] for k in ("native_pressure", "loop_pressure") if k in out}
        write_doc(args.doc, out["info"], out["native"], out["loop"], out["mismatches"],
                  args, out["command"], pressure, out["native_wrong"])
        print(f"wrote {args.doc} from {args.json}")
        return 0

    import tempfile

    # Engines in fresh processes, sides alternating (the machine may be
    # shared: timings are the best over all runs of a side).
    runs = []
    for _ in range(args.rounds):
        runs += [("native", args.kv_mib, args.latency_n), ("loop", args.kv_mib, args.latency_n)]
    if args.pressure_kv_mib:
        for _ in range(args.rounds):
            runs += [("native_pressure", args.pressure_kv_mib, 0),
                     ("loop_pressure", args.pressure_kv_mib, 0)]
    all_runs: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (key, kv, lat_n) in enumerate(runs):
            side = key.split("_")[0]
            dump = Path(tmp) / f"{i}.json"
            cmd = [sys.executable, str(Path(__file__).resolve()), "--side", side,
                   "--dump", str(dump), "--n", str(args.n), "--seed", str(args.seed),
                   "--model", str(args.model), "--repeats", str(args.repeats),
                   "--latency-n", str(lat_n), "--kv-mib", str(kv)]
            print(f"[{i + 1}/{len(runs)}] {side}, KV cache {kv} MiB ...", flush=True)
            subprocess.run(cmd, check=True)
            all_runs.setdefault(key, []).append(json.loads(dump.read_text()))
    results = {}
    for key, rs in all_runs.items():
        results[key] = {
            "records": rs[0]["records"],
            "all_records": [r["records"] for r in rs],
            "batch_seconds": [t for r in rs for t in r["batch_seconds"]],
            "latency_seconds": min((r["latency_seconds"] for r in rs),
                                   key=lambda lat: sum(lat) if lat else 0.0),
        }
    nat, lp = results["native"]["records"], results["loop"]["records"]

    def differ(a, b):
        return (a["token_ids"] != b["token_ids"] or a["text"] != b["text"]
                or a["prompt_token_ids"] != b["prompt_token_ids"])

    mismatches = [{"digits": a["digits"], "native": a["text"], "loop": b["text"]}
                  for a, b in zip(nat, lp) if differ(a, b)]
    # Every other run (other processes, KV pressure) must give the very same tokens.
    for key, res in results.items():
        for recs in res["all_records"]:
            mismatches += [{"digits": a["digits"], "native": a["text"], key: b["text"]}
                           for a, b in zip(nat, recs) if differ(a, b)]
    native, loop = summarize(results["native"]), summarize(results["loop"])
    pressure = {k: summarize(results[k]) for k in ("native_pressure", "loop_pressure")
                if k in results}
    import torch
    import vllm

    training = {}
    tj = Path(args.model) / "training.json"
    if tj.is_file():
        training = json.loads(tj.read_text())
    info = {"torch": torch.__version__, "vllm": vllm.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": git_commit(("vllm_seqhooks",)) or "?", "machine": machine(),
            "training": {k: v for k, v in training.items() if k != "history"}}
    command = "python scripts/eval_forkjoin.py " + " ".join(
        argv if argv is not None else sys.argv[1:])
    wrong = [{"digits": r["digits"], "text": r["text"]} for r in nat
             if not task.check(r["digits"], r["text"])]
    out = {"info": info, "command": command.strip(), "n": args.n, "seed": args.seed,
           "kv_mib": args.kv_mib, "pressure_kv_mib": args.pressure_kv_mib,
           "rounds": args.rounds, "repeats": args.repeats,
           "native": native, "loop": loop, **pressure, "mismatches": mismatches,
           "native_wrong": wrong}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2) + "\n")
    args.doc.parent.mkdir(parents=True, exist_ok=True)
    write_doc(args.doc, info, native, loop, mismatches, args, command.strip(), pressure, wrong)
    print(json.dumps({k: v for k, v in out.items() if k not in ("info",)}, indent=2)[:4000])
    print(f"wrote {args.doc} and {args.json}")
    return 0 if not mismatches else 1


if __name__ == "__main__":
    raise SystemExit(main())
