"""Load on loopback: many concurrent streaming requests with hooks against a
real ``vllm serve`` (tiny model, scripted hook tokens).

Every response is checked against the expected merged text; afterwards the
server must hold no request, no parked parent, no child and no KV block.

    .venv/bin/python -m benchmarks.serve_load --requests 200 --concurrency 200

Prints (and with --out writes) requests/s and latency percentiles.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from tests.support.server import (
    SCRIPTED,
    TINY_FLAGS,
    TINY_HOOK_FLAGS,
    metric,
    scrape,
    start_server,
)


def request_body(model: str, S, i: int) -> tuple[dict, str]:
    """A streaming completion whose parent forks two children; and the text
    the client must receive."""
    script = f"q{i}<promise>a</promise><promise>b</promise><sync>ok"
    children = {"0": f"left{i}", "1": f"right{i}"}
    body = {
        "model": model, "prompt": f"request {i}", "max_tokens": 64, "temperature": 0,
        "stream": True,
        "vllm_xargs": {
            "seqhooks_script": S(script), "seqhooks_script_end": "eos",
            "seqhooks_eos_token_id": 2,
            "seqhooks_child_scripts": json.dumps({k: S(v) for k, v in children.items()}),
            "seqhooks_child_script_end": "eos",
        },
    }
    expected = f"q{i}<promise>a</promise><promise>b</promise><sync>left{i}\nright{i}ok"
    return body, expected


async def _one(session, url, body, expected, timeout):
    t0 = time.perf_counter()
    text = []
    async with session.post(url + "/v1/completions", json=body,
                            timeout=timeout) as resp:
        if resp.status != 200:
            return False, time.perf_counter() - t0, f"HTTP {resp.status}: {await resp.text()}"
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices", ()):
                text.append(choice.get("text") or "")
    got = "".join(text)
    ok = got == expected
    return ok, time.perf_counter() - t0, None if ok else f"got {got!r}, want {expected!r}"


async def run_load(url: str, model: str, S, *, requests: int, concurrency: int,
                   timeout_s: float = 600) -> dict:
    import aiohttp

    sem = asyncio.Semaphore(concurrency)
    conn = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    results = []

    async with aiohttp.ClientSession(connector=conn) as session:
        async def task(i):
            body, expected = request_body(model, S, i)
            async with sem:
                try:
                    results.append(await _one(session, url, body, expected, timeout))
                except Exception as exc:  # counted as an error, reported below
                    results.append((False, float("nan"), repr(exc)))

        t0 = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(task(i) for i in range(requests))),
                               timeout=timeout_s)
        wall = time.perf_counter() - t0
    lat = [r[1] for r in results if r[0]]
    errors = [r[2] for r in results if not r[0]]
    return {
        "requests": requests, "concurrency": concurrency, "ok": len(lat),
        "errors": len(errors), "first_errors": errors[:3], "wall_s": wall,
        "requests_per_s": requests / wall, **percentiles(lat),
    }


def percentiles(latencies: list[float]) -> dict:
    """p50, p99 (nearest rank) and mean of latencies in seconds."""
    if not latencies:
        return {"p50_s": float("nan"), "p99_s": float("nan"), "mean_s": float("nan")}
    v = sorted(latencies)

    def pct(p):
        return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]

    return {"p50_s": pct(50), "p99_s": pct(99), "mean_s": statistics.fmean(v)}


def wait_drained(url: str, timeout: float = 30) -> dict:
    """Poll /metrics until nothing is running, parked or allocated."""
    deadline = time.time() + timeout
    while True:
        m = scrape(url)
        state = {name: metric(m, name) for name in (
            "vllm:num_requests_running", "vllm:num_requests_waiting",
            "vllm:seqhooks_parked_requests", "vllm:seqhooks_open_children",
            "vllm:kv_cache_usage_perc")}
        if not any(state.values()) or time.time() > deadline:
            return state
        time.sleep(0.3)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--model-dir", default=None, help="tiny model dir (built if missing)")
    parser.add_argument("--out", type=Path,
                        help="JSON file for the result (default: print only)")
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    from vllm_seqhooks.scripted.processor import encode_script
    from vllm_seqhooks.scripted.tiny_model import build_tiny_model

    workdir = Path(tempfile.mkdtemp(prefix="seqhooks-load-"))
    model = str(build_tiny_model(args.model_dir or workdir / "tiny"))
    tok = AutoTokenizer.from_pretrained(model)
    S = lambda text: encode_script(tok, text)  # noqa: E731
    srv = start_server(model, *TINY_FLAGS, *TINY_HOOK_FLAGS, "--max-num-seqs", "256",
                       "--logits-processors", SCRIPTED, log_path=workdir / "server.log")
    try:
        result = asyncio.run(run_load(srv.url, model, S, requests=args.requests,
                                      concurrency=args.concurrency))
        result["after"] = wait_drained(srv.url)
    finally:
        srv.stop()
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
        print(f"wrote {args.out}")
    return 0 if result["errors"] == 0 and not any(result["after"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
