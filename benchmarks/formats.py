"""Tag formats: native fork/join against each format's own inference loop.

    python -m benchmarks.formats --out docs/benchmarks      # in-process and HTTP
    python -m benchmarks.formats --smoke                     # a quick check

For each preset (threadweaver, multiverse, npr, parallel-r1), a batch of
families written in its format with scripted tokens on the tiny model
(:mod:`tests.support.format_scripts`: a long prompt, an outline of k
items, children of ``child_tokens`` tokens, a continuation after the join):

* in-process: ``vllm_seqhooks.LLM(special_kwargs=NAME)`` against
  :class:`~vllm_seqhooks.loops.format_loop.FormatLoop` over a stock ``vllm.LLM``
  (lockstep rounds), interleaved repeats, order rotated;
* over HTTP, the loop as those projects run it: an OpenAI client against a
  stock ``vllm serve``, each parent stopping at the fork tag (stop string),
  its children sent concurrently, the parent re-sent with the merged tokens;
  against ``vllm serve --seqhooks NAME`` answering each family in one request.
  All families are in flight at once.

Reported: wall time (native / loop ratio, median of the repeats), tokens the
engine computed (prompt tokens not served by the prefix cache, plus sampled
tokens, children included), and whether native and loop gave the same tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

PRESETS = ("threadweaver", "multiverse", "npr", "parallel-r1")
SIZES = {
    "smoke": dict(batch=2, context=64, k=2, child_tokens=8, continuation=4, repeats=1),
    "default": dict(batch=8, context=512, k=4, child_tokens=48, continuation=16, repeats=3),
}


def spec(name: str) -> dict[str, Any]:
    # NPR forks only with 1,024 tokens left; these families are shorter.
    return {"format": name, "max_child_depth": 1, "fork_min_tokens": 1}


def workload(name: str, size: dict[str, Any], S, seed: int):
    """``size["batch"]`` families; the prompts differ between presets and
    seeds (the stock engine's prefix cache serves every preset)."""
    from tests.support.format_scripts import format_script

    rng = random.Random(f"{name}:{seed}")
    prompts, params = [], []
    for _ in range(size["batch"]):
        prompts.append(S("".join(rng.choice("abcdefghij ") for _ in range(size["context"]))))
        fs = format_script(name, rng, k=size["k"], child_tokens=size["child_tokens"],
                           continuation=size["continuation"])
        params.append(S.params(fs.before + fs.after, fs.children, max_tokens=1024))
    return prompts, params


# ------------------------------------------------------------------ in-process
def native_computed(out) -> int:
    usage = (getattr(out, "hook_trace", None) or {}).get("usage", {})
    prompt = len(out.prompt_token_ids) - int(out.num_cached_tokens or 0)
    return (prompt + usage.get("family_prefilled_tokens", 0)
            + usage.get("family_sampled_tokens", len(out.outputs[0].token_ids)))


def loop_computed(res) -> int:
    return (res.prefilled_tokens + res.sampled_tokens
            + sum(len(c.output_token_ids) for c in res.children))


def in_process(model: str, size: dict[str, Any]) -> list[dict[str, Any]]:
    import vllm

    from vllm_seqhooks.loops.format_loop import FormatLoop
    from vllm_seqhooks.llm import LLM
    from tests.support.forkjoin import Scripts, scripted_engine_kwargs

    kwargs = scripted_engine_kwargs(model, max_model_len=4096)
    stock = vllm.LLM(model, **kwargs)
    S = Scripts(stock.get_tokenizer())
    rows = []
    for name in PRESETS:
        native = LLM(model, special_kwargs=spec(name), **kwargs)
        loop = FormatLoop(stock, spec(name))
        warm = workload(name, SIZES["smoke"], S, seed=999)
        native.generate(*warm, use_tqdm=False)
        loop.generate(*warm)
        runs: dict[str, list[dict[str, Any]]] = {"native": [], "loop": []}
        same = True
        for r in range(size["repeats"]):
            prompts, params = workload(name, size, S, seed=r)
            order = ["native", "loop"] if r % 2 == 0 else ["loop", "native"]
            got: dict[str, list[list[int]]] = {}
            for config in order:
                t0 = time.perf_counter()
                if config == "native":
                    outs = native.generate(prompts, params, use_tqdm=False)
                    seconds = time.perf_counter() - t0
                    computed = sum(native_computed(o) for o in outs)
                    got[config] = [list(o.outputs[0].token_ids) for o in outs]
                else:
                    results = loop.generate(prompts, params)
                    seconds = time.perf_counter() - t0
                    computed = sum(loop_computed(res) for res in results)
                    got[config] = [res.token_ids for res in results]
                runs[config].append({"seconds": seconds, "computed_tokens": computed})
            same = same and got["native"] == got["loop"]
        rows.append(summarize(name, runs, same))
        print(json.dumps(rows[-1]), flush=True)
        del native
    return rows


def summarize(name: str, runs: dict[str, list[dict[str, Any]]], same: bool) -> dict[str, Any]:
    def med(config: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[config])

    ratios = [n["seconds"] / lp["seconds"] for n, lp in zip(runs["native"], runs["loop"])]
    return {
        "format": name,
        "native_s": round(med("native", "seconds"), 3),
        "loop_s": round(med("loop", "seconds"), 3),
        "latency_ratio": round(statistics.median(ratios), 3),
        "latency_ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
        "native_computed": int(med("native", "computed_tokens")),
        "loop_computed": int(med("loop", "computed_tokens")),
        "computed_ratio": round(med("native", "computed_tokens")
                                / med("loop", "computed_tokens"), 3),
        "same_tokens": same,
    }


# ------------------------------------------------------------------------ HTTP
def flat_xargs(sp, **extra) -> dict[str, Any]:
    """``vllm_xargs`` holds flat values: nested scripts travel as JSON."""
    out = {**sp.extra_args, **extra}
    return {k: json.dumps(v) if isinstance(v, dict) else v for k, v in out.items()}


async def http_loop_family(client, model: str, hooks, codec, prompt: list[int], sp) -> dict:
    """One family as the formats' own orchestrators run it over HTTP."""
    from vllm_seqhooks.config.request_keys import CHILD_KEY_ARG, SAMPLED_BEFORE_ARG
    from vllm_seqhooks.loops.format_loop import child_contribution
    from vllm_seqhooks.formats.boundaries import ChildText, child_prompt, join_tokens
    from vllm_seqhooks.formats.events import ForkReached
    from vllm_seqhooks.formats.tag_format_scanner import TagFormatScanner

    fmt = hooks.tag_format
    context, sampled, computed, out, spawned = list(prompt), 0, 0, [], 0
    scanner = TagFormatScanner(fmt, codec, may_fork=True, ends_at_tag=False, max_children=16)

    async def call(ids, max_tokens, stop, extra):
        r = await client.completions.create(
            model=model, prompt=ids, max_tokens=max_tokens, temperature=0, stop=[stop],
            extra_body={"vllm_xargs": flat_xargs(sp, **extra), "return_token_ids": True,
                        "stop_token_ids": list(sp.stop_token_ids or [])})
        details = r.usage.prompt_tokens_details
        cached = (details.cached_tokens or 0) if details else 0
        toks = list(r.choices[0].token_ids)
        return toks, r.choices[0], r.usage.prompt_tokens - cached + len(toks)

    while True:
        extra = {SAMPLED_BEFORE_ARG: sampled} if sampled else {}
        new, choice, cost = await call(context, sp.max_tokens - sampled, fmt.fork_tag, extra)
        computed += cost
        fork = next((e for e in scanner.feed(new, len(context)) if isinstance(e, ForkReached)),
                    None)
        if fork is not None:
            new = new[: fork.pos + 1 - len(context)]
        context += new
        out += new
        sampled += len(new)
        if fork is None:
            if choice.finish_reason == "stop" and choice.stop_reason == fmt.fork_tag:
                continue
            return {"tokens": out, "computed": computed}
        prompts = [child_prompt(codec, fmt, context, fork.tag_start, label)[0]
                   for label in fork.labels]
        budget = max(1, sp.max_tokens - sampled)
        # Children keys count in promise order over all the parent's forks.
        kids = await asyncio.gather(*[
            call(p, budget, fmt.child_end_tag, {CHILD_KEY_ARG: str(spawned + i)})
            for i, p in enumerate(prompts)])
        spawned += len(prompts)
        children, closed = [], True
        for label, (toks, ch, cost) in zip(fork.labels, kids):
            computed += cost
            tokens, text, at_tag = child_contribution(fmt, codec, toks, ch.finish_reason,
                                                      ch.stop_reason)
            children.append(ChildText(label, tokens, text))
            closed = closed and at_tag
        stops = fmt.unclosed_child_stop_text is not None and not closed
        # The merge replaces the fork tag's last token (formats.boundaries).
        merged = join_tokens(codec, fmt, context, fork.tag_start, children,
                             codec.encode(hooks.merge_separator),
                             fmt.unclosed_child_stop_text if stops else fmt.merge_suffix)
        del context[-1], out[-1]
        context += merged
        out += merged
        if stops:
            return {"tokens": out, "computed": computed}


async def http_native_family(client, model: str, prompt: list[int], sp) -> dict:
    r = await client.completions.create(
        model=model, prompt=prompt, max_tokens=sp.max_tokens, temperature=0,
        extra_body={"vllm_xargs": flat_xargs(sp), "return_token_ids": True,
                    "stop_token_ids": list(sp.stop_token_ids or [])})
    usage = r.model_extra["kv_transfer_params"]["seqhooks"]["usage"]
    details = r.usage.prompt_tokens_details
    cached = (details.cached_tokens or 0) if details else 0
    computed = (len(prompt) - cached + usage["family_prefilled_tokens"]
                + usage["family_sampled_tokens"])
    return {"tokens": list(r.choices[0].token_ids), "computed": computed}


async def _batch(url: str, family, prompts, params):
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
    try:
        t0 = time.perf_counter()
        results = await asyncio.gather(*[family(client, p, sp)
                                         for p, sp in zip(prompts, params)])
        return time.perf_counter() - t0, results
    finally:
        await client.close()


def over_http(model: str, size: dict[str, Any], workdir: Path) -> list[dict[str, Any]]:
    from vllm_seqhooks.config.special_kwargs import SpecialKwargs
    from vllm_seqhooks.formats.text_codec import TextCodec
    from vllm_seqhooks.config.presets import expand
    from tests.support.forkjoin import Scripts
    from tests.support.server import SCRIPTED, TINY_FLAGS, start_server
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    S = Scripts(tok)
    codec = TextCodec.from_tokenizer(tok, 128)
    flags = [*TINY_FLAGS, "--max-model-len", "4096", "--logits-processors", SCRIPTED,
             "--enable-prompt-tokens-details"]
    stock = start_server(model, *flags, log_path=workdir / "stock.log")
    rows = []
    try:
        for name in PRESETS:
            native = start_server(model, *flags, "--seqhooks", name, "--max-child-depth", "1",
                                  "--fork-min-tokens", "1", log_path=workdir / f"native-{name}.log")
            try:
                hooks = SpecialKwargs(**expand(spec(name)))
                runs: dict[str, list[dict[str, Any]]] = {"native": [], "loop": []}
                same = True
                for r in range(size["repeats"] + 1):  # the first warms both up
                    prompts, params = workload(name, size, S, seed=r)
                    got = {}
                    order = ["native", "loop"] if r % 2 == 0 else ["loop", "native"]
                    for config in order:
                        if config == "native":
                            url = native.url
                            family = lambda c, p, sp: http_native_family(c, model, p, sp)  # noqa: E731
                        else:
                            url = stock.url
                            family = lambda c, p, sp: http_loop_family(c, model, hooks, codec, p, sp)  # noqa: E731
                        seconds, results = asyncio.run(_batch(url, family, prompts, params))
                        got[config] = [x["tokens"] for x in results]
                        if r:
                            runs[config].append({"seconds": seconds, "computed_tokens":
                                                 sum(x["computed"] for x in results)})
                    same = same and got["native"] == got["loop"]
                rows.append(summarize(name, runs, same))
                print(json.dumps(rows[-1]), flush=True)
            finally:
                native.stop()
    finally:
        stock.stop()
    return rows


# ---------------------------------------------------------------------- report
def markdown(results: dict[str, Any], command: str) -> str:
    size = results["size"]
    lines = [
        "# Tag formats: native fork/join vs each format's own loop",
        "",
        f"Command: `{command}`. Tiny model (character tokenizer: every tag is several",
        f"tokens), scripted tokens, greedy; {size['batch']} families at once, each with a",
        f"{size['context']}-token prompt, an outline of {size['k']} items (Parallel-R1: 2",
        f"children), children of {size['child_tokens']} tokens, {size['continuation']}",
        f"tokens after the join; median of {size['repeats']} interleaved repeats.",
        "Computed tokens: prompt tokens not served by the prefix cache plus sampled",
        "tokens, children included. `same` = native and loop gave the same tokens.",
        "",
    ]
    for part, title in (("in_process", "In-process (FormatLoop over a stock vllm.LLM)"),
                        ("http", "Over HTTP (OpenAI client over a stock vllm serve, children "
                                 "sent concurrently)")):
        if not results.get(part):
            continue
        lines += [f"## {title}", "",
                  "| format | native s | loop s | latency native/loop [range] | computed native"
                  " | computed loop | computed native/loop | same |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
        for r in results[part]:
            lo, hi = r["latency_ratio_range"]
            lines.append(
                f"| {r['format']} | {r['native_s']} | {r['loop_s']} | {r['latency_ratio']}"
                f" [{lo}-{hi}] | {r['native_computed']} | {r['loop_computed']} |"
                f" {r['computed_ratio']} | {'yes' if r['same_tokens'] else 'NO'} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one repeat")
    parser.add_argument("--no-http", action="store_true")
    parser.add_argument("--out", type=Path,
                        help="directory for formats.{json,md} (default: print only; "
                             "the published page changes only with --out docs/benchmarks)")
    args = parser.parse_args(argv)

    from benchmarks.common import setup_env

    setup_env()
    from vllm_seqhooks.scripted.tiny_model import build_tiny_model

    size = SIZES["smoke" if args.smoke else "default"]
    workdir = Path(tempfile.mkdtemp(prefix="seqhooks-formats-"))
    model = str(build_tiny_model(workdir / "tiny"))
    results: dict[str, Any] = {"size": size, "in_process": in_process(model, size)}
    if not args.no_http:
        results["http"] = over_http(model, size, workdir)
    command = ".venv/bin/python -m benchmarks.formats" + (" --smoke" if args.smoke else "") + (
        " --no-http" if args.no_http else "") + (f" --out {args.out}" if args.out else "")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "formats.json").write_text(json.dumps(results, indent=2) + "\n")
        (args.out / "formats.md").write_text(markdown(results, command))
        print(f"wrote {args.out / 'formats.md'} and formats.json")
    print(markdown(results, command))
    ok = all(r["same_tokens"] for part in ("in_process", "http") for r in results.get(part, []))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
