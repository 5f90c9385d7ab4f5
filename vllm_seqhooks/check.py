"""``python -m vllm_seqhooks.check``: check an installation end to end.

Starts real ``vllm serve`` processes on 127.0.0.1 with sequence hooks on
vLLM's defaults for this machine (on a GPU: Model Runner V2, async
scheduling, CUDA graphs; on CPU: the V1 runner), talks to them with the
``openai`` client, and prints a pass/fail table:

1. **scripted** -- a tiny random model built offline whose hook tokens are
   forced by the scripted-token logits processor (the V1 or V2 class, for
   the runner vLLM picks): merged text; the parent after a join continues
   exactly like a fresh request given the same context; a forked child
   equals a fresh request on the parent's context; nothing left allocated
   (``/metrics``: KV cache usage, open children, parked requests).
2. **trained** -- the embedded model trained to sort digits with fork/join
   (it writes its hook tokens itself): answers correct; nothing left.
3. **trained + ngram** -- the same with ngram speculative decoding (which
   vLLM refuses with any custom logits processor, hence the trained model):
   tokens identical to (2), answers correct, nothing left.

Exit status 0 when every check passes, 1 otherwise. ``--log-dir`` keeps the
servers' logs.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

#: Speculative decoding used by configuration (3).
NGRAM = {"method": "ngram", "num_speculative_tokens": 3,
         "prompt_lookup_max": 3, "prompt_lookup_min": 1}
#: Fraction of the held-out problems the trained model must get right.
MIN_ACCURACY = 0.95


@dataclass
class Result:
    config: str
    check: str
    ok: bool
    detail: str = ""


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def _platform_flags(*, block_size: int = 32) -> list[str]:
    """CPU: no graph capture to wait for, and the CPU backend's block size."""
    return ["--enforce-eager", "--block-size", str(block_size)] if _on_cpu() else []


def trained_engine_flags() -> list[str]:
    """``vllm serve`` engine flags for the embedded trained model (its
    ``tasks.forkjoin.ENGINE_KWARGS``, as far as a server needs them)."""
    return ["--dtype", "float32", "--max-model-len", "256", "--seed", "0",
            "--kv-cache-memory-bytes", str(128 << 20), *_platform_flags()]


def _client(url: str):
    from openai import OpenAI

    return OpenAI(base_url=url + "/v1", api_key="unused", timeout=300)


def _drained(url: str, timeout: float = 30) -> tuple[bool, str]:
    """Whether the server holds nothing once idle: KV blocks, children,
    parked parents, requests."""
    from vllm_seqhooks.local_server import metric, scrape

    names = ("vllm:kv_cache_usage_perc", "vllm:seqhooks_open_children",
             "vllm:seqhooks_parked_requests", "vllm:num_requests_running",
             "vllm:num_requests_waiting")
    deadline = time.time() + timeout
    while True:
        samples = scrape(url)
        values = {n: metric(samples, n) for n in names}
        if not any(values.values()):
            return True, ""
        if time.time() > deadline:
            return False, ", ".join(f"{n}={v:g}" for n, v in values.items() if v)
        time.sleep(0.5)


def _token_ids(choice) -> list[int]:
    return list((choice.model_extra or {}).get("token_ids") or [])


# ---------------------------------------------------------------- scripted
def scripted_checks(url: str, model: str, add: Callable[..., None]) -> None:
    from transformers import AutoTokenizer

    from vllm_seqhooks.scripted.processor import encode_script
    from vllm_seqhooks.scripted.tiny_model import EOS_ID

    tokenizer = AutoTokenizer.from_pretrained(model)
    ids = lambda text: encode_script(tokenizer, text)  # noqa: E731
    client = _client(url)

    def xargs(script, children, end="eos", **extra):
        return {"seqhooks_script": ids(script), "seqhooks_script_end": end,
                "seqhooks_eos_token_id": EOS_ID,
                "seqhooks_child_scripts": json.dumps({k: ids(v) for k, v in children.items()}),
                "seqhooks_child_script_end": "eos", **extra}

    def complete(prompt, max_tokens, vllm_xargs):
        return client.completions.create(
            model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
            extra_body={"vllm_xargs": vllm_xargs, "return_token_ids": True}).choices[0]

    script = "ab<promise>xy</promise><promise>zw</promise>c<sync>done"
    want = "ab<promise>xy</promise><promise>zw</promise>c<sync>AAA\nBBBBdone"
    got = complete("hello", 64, xargs(script, {"0": "AAA", "1": "BBBB"})).text
    add("merged text", got == want, "" if got == want else f"got {got!r}")

    prompt_ids = tokenizer.encode("The quick brown fox jumps over the lazy dog.")
    script_ids, merged = ids("<promise>xy</promise>c<sync>"), ids("AAA")
    free = 16
    parent = _token_ids(complete(prompt_ids, len(script_ids) + free,
                                 xargs("<promise>xy</promise>c<sync>", {"0": "AAA"}, end="free")))
    fresh = _token_ids(complete(prompt_ids + script_ids + merged, free,
                                {"seqhooks_enabled": False}))
    cont = parent[len(script_ids) + len(merged):]
    ok = parent[: len(script_ids) + len(merged)] == script_ids + merged and cont == fresh
    add("continuation == fresh request", ok and len(cont) == free,
        "" if ok else f"after join {cont}, fresh {fresh}")

    fork = ids("<promise>xy</promise><sync>")
    parent = complete(prompt_ids, 64, xargs("<promise>xy</promise><sync>", {}, end="eos",
                                            seqhooks_child_max_tokens=10))
    fresh = _token_ids(complete(prompt_ids + fork[:-1], 10, {"seqhooks_enabled": False}))
    child = _token_ids(parent)[len(fork): len(fork) + 10]
    add("forked child == fresh request", child == fresh and len(fresh) == 10,
        "" if child == fresh else f"child {child}, fresh {fresh}")


# ----------------------------------------------------------------- trained
def trained_outputs(url: str, model: str, problems) -> list[tuple[str, list[int]]]:
    from concurrent.futures import ThreadPoolExecutor

    from vllm_seqhooks.tasks import forkjoin as task

    client = _client(url)

    def one(problem):
        choice = client.completions.create(
            model=model, prompt=problem.prompt, max_tokens=task.PARENT_MAX_TOKENS,
            temperature=0, extra_body={"return_token_ids": True}).choices[0]
        return choice.text, _token_ids(choice)

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, problems))


def trained_checks(outputs, problems, add: Callable[..., None]) -> None:
    from vllm_seqhooks.tasks import forkjoin as task

    correct = sum(task.check(p, text) for p, (text, _ids) in zip(problems, outputs))
    add("answers correct", correct >= MIN_ACCURACY * len(problems),
        f"{correct}/{len(problems)}")


# -------------------------------------------------------------------- main
def run(args: argparse.Namespace) -> list[Result]:
    from vllm_seqhooks.scripted.processor import (
        SCRIPTED_LOGITS_PROCESSOR_FQCN,
        SCRIPTED_LOGITS_PROCESSOR_V2_FQCN,
    )
    from vllm_seqhooks.local_server import start_server
    from vllm_seqhooks.scripted.tiny_model import TINY_HOOK_FLAGS
    from vllm_seqhooks.scripted.tiny_model import build_tiny_model
    from vllm_seqhooks.scripted.runner_choice import uses_v2_model_runner

    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="seqhooks-check-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    results: list[Result] = []

    def serve(config: str, model: str, flags: list[str],
              body: Callable[[str, Callable[..., None]], None]) -> None:
        def add(check: str, ok: bool, detail: str = "") -> None:
            results.append(Result(config, check, bool(ok), detail))

        try:
            server = start_server(model, *flags, log_path=log_dir / f"{config}.log",
                                  timeout=args.timeout)
        except RuntimeError as exc:
            add("server starts", False, str(exc).splitlines()[0])
            return
        try:
            add("server starts", True)
            body(server.url, add)
            ok, detail = _drained(server.url)
            add("nothing left allocated", ok, detail)
        except Exception as exc:  # noqa: BLE001 - reported in the table
            add("requests", False, f"{type(exc).__name__}: {exc}")
        finally:
            server.stop()

    tiny = str(build_tiny_model(Path(tempfile.mkdtemp(prefix="seqhooks-check-model-")) / "m"))
    v2 = uses_v2_model_runner({"model": tiny})
    processor = SCRIPTED_LOGITS_PROCESSOR_V2_FQCN if v2 else SCRIPTED_LOGITS_PROCESSOR_FQCN
    tiny_flags = ["--dtype", "float32", "--max-model-len", "1024",
                  "--kv-cache-memory-bytes", str(64 << 20), *_platform_flags(),
                  *TINY_HOOK_FLAGS, "--logits-processors", processor]
    serve("scripted", tiny, tiny_flags, lambda url, add: scripted_checks(url, tiny, add))

    _trained_configs(serve, args.problems)
    return results


def _trained_configs(serve: Callable[..., None], num_problems: int) -> None:
    """Configurations (2) and (3): the trained model, then with ngram
    speculative decoding, whose tokens must equal (2)'s."""
    from vllm_seqhooks.engine.serve_flags import hook_flags
    from vllm_seqhooks.tasks import forkjoin as task

    trained = str(task.model_dir())
    problems = task.heldout_problems(num_problems)
    trained_flags = [*trained_engine_flags(), *hook_flags(task.hook_settings())]
    reference: list = []

    def trained_body(url, add):
        reference.extend(trained_outputs(url, trained, problems))
        trained_checks(reference, problems, add)

    serve("trained", trained, trained_flags, trained_body)

    def speculative_body(url, add):
        from vllm_seqhooks.local_server import metric, scrape

        outputs = trained_outputs(url, trained, problems)
        drafts = metric(scrape(url), "vllm:spec_decode_num_draft_tokens_total")
        add("draft tokens verified", drafts > 0, f"{drafts:g} drafts")
        trained_checks(outputs, problems, add)
        same = bool(reference) and [ids for _t, ids in outputs] == [ids for _t, ids in reference]
        add("tokens == without speculation", same,
            "" if same else "no reference" if not reference else "outputs differ")

    serve("trained+ngram", trained,
          [*trained_flags, "--speculative-config", json.dumps(NGRAM)], speculative_body)


def format_table(results: list[Result], header: str) -> str:
    width = max([len(r.config) for r in results] + [6])
    check_width = max([len(r.check) for r in results] + [5])
    lines = [header, f"{'config':<{width}}  {'check':<{check_width}}  result"]
    for r in results:
        line = f"{r.config:<{width}}  {r.check:<{check_width}}  {'PASS' if r.ok else 'FAIL'}"
        if r.detail:
            line += f"  ({r.detail})"
        lines.append(line)
    passed = sum(r.ok for r in results)
    lines.append(f"{passed} passed, {len(results) - passed} failed")
    return "\n".join(lines)


def describe_machine() -> str:
    import vllm
    from vllm.platforms import current_platform

    from vllm_seqhooks.scripted.runner_choice import uses_v2_model_runner

    runner = "V2" if uses_v2_model_runner(None) else "V1"
    return (f"vLLM {vllm.__version__} on {current_platform.device_name or 'cpu'}; "
            f"model runner {runner} by default")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_seqhooks.check",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", type=int, default=24,
                        help="held-out problems for the trained model (default 24)")
    parser.add_argument("--timeout", type=float, default=600,
                        help="seconds for each server to become healthy")
    parser.add_argument("--log-dir", help="where the servers' logs go (default: a temp dir)")
    args = parser.parse_args(argv)
    results = run(args)
    print(format_table(results, describe_machine()))
    return 0 if results and all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
