"""Many users, one engine: other users' latency beside fork bombs.

A real ``vllm serve`` (tiny model, scripted hook tokens, ``--max-num-seqs
16``, ``--max-child-depth 2 --max-children-per-request 16``) serves steady
plain traffic: ``--clients`` clients, each sending plain completions (hooks
off, 32 tokens) one after the other. Measured twice on the same server:

* alone;
* beside ``--bombs`` fork-bombing clients: each request writes 16 promises,
  each child 16 more, each grandchild samples up to 200 tokens (a client
  sends its next bomb when one finishes).

and on two servers started in the same run: ``limits off`` (the behaviour
before family limits existed: fair share off, budgets and descendant
limits out of reach) and ``limits on`` (the
defaults). Reported: the plain requests' p50/p99 latency alone and beside
the bombs, and what each bomb's family sampled (from its trace).

    .venv/bin/python -m benchmarks.many_users --out docs/benchmarks
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from benchmarks.serve_load import percentiles
from tests.support.server import (
    SCRIPTED,
    TINY_FLAGS,
    TINY_HOOK_FLAGS,
    start_server,
)

SERVER_FLAGS = ["--max-num-seqs", "16", "--max-child-depth", "2",
                "--max-children-per-request", "16", "--logits-processors", SCRIPTED]
CONFIGS = {
    "limits off": ["--fair-share", "off",
                   "--family-token-factor", "1000000", "--max-descendants", "1000000",
                   "--max-live-children-per-family", "1000000"],
    "limits on": [],
}
PLAIN_TOKENS = 32
LEAF_TOKENS = 200
BOMB_MAX_TOKENS = 1000


def plain_body(model: str) -> dict:
    return {"model": model, "prompt": "a plain question", "max_tokens": PLAIN_TOKENS,
            "temperature": 0, "ignore_eos": True,
            "vllm_xargs": {"seqhooks_enabled": False}}


def bomb_body(model: str, S) -> dict:
    fan = "<promise>x</promise>" * 16 + "<sync>"
    return {"model": model, "prompt": "a fork bomb", "max_tokens": BOMB_MAX_TOKENS,
            "temperature": 0,
            "vllm_xargs": {
                "seqhooks_script": S(fan), "seqhooks_script_end": "eos",
                "seqhooks_eos_token_id": 2,
                # Children write 16 promises too; grandchildren cannot spawn
                # (depth 2) and sample freely up to their budget.
                "seqhooks_child_default_script": S(fan),
                "seqhooks_child_script_end": "free",
                "seqhooks_child_max_tokens": LEAF_TOKENS,
            }}


async def _post(session, url: str, body: dict) -> tuple[float, dict | None, str | None]:
    t0 = time.perf_counter()
    async with session.post(url + "/v1/completions", json=body) as resp:
        text = await resp.text()
        dt = time.perf_counter() - t0
        if resp.status != 200:
            return dt, None, f"HTTP {resp.status}: {text[:200]}"
        return dt, json.loads(text), None


async def plain_traffic(session, url: str, model: str, clients: int,
                        per_client: int) -> dict:
    latencies: list[float] = []
    errors: list[str] = []

    async def client() -> None:
        for _ in range(per_client):
            dt, out, err = await _post(session, url, plain_body(model))
            if err:
                errors.append(err)
            else:
                assert out["usage"]["completion_tokens"] == PLAIN_TOKENS
                latencies.append(dt)

    await asyncio.gather(*(client() for _ in range(clients)))
    return {"n": len(latencies), "errors": errors[:3], **percentiles(latencies)}


async def measure(url: str, model: str, S, *, clients: int, per_client: int,
                  bombs: int, timeout_s: float) -> dict:
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        # Warm-up, then the plain traffic alone.
        await plain_traffic(session, url, model, clients, 1)
        alone = await plain_traffic(session, url, model, clients, per_client)
        stop = asyncio.Event()
        bomb_results: list[dict] = []

        async def bomber() -> None:
            while not stop.is_set():
                dt, out, err = await _post(session, url, bomb_body(model, S))
                trace = (out or {}).get("kv_transfer_params", {}).get("seqhooks", {})
                bomb_results.append({
                    "wall_s": dt, "error": err,
                    "finish_reason": out["choices"][0]["finish_reason"] if out else None,
                    "usage": trace.get("usage"), "limits": trace.get("limits"),
                })

        tasks = [asyncio.create_task(bomber()) for _ in range(bombs)]
        await asyncio.sleep(2.0)  # the bombs' first levels spawn
        beside = await plain_traffic(session, url, model, clients, per_client)
        stop.set()
        await asyncio.gather(*tasks)
    return {"alone": alone, "beside_bombs": beside, "bombs": bomb_results}


def summarize(name: str, r: dict) -> dict:
    done = [b for b in r["bombs"] if b["usage"]]
    return {
        "config": name,
        "plain_alone_p50_s": r["alone"]["p50_s"], "plain_alone_p99_s": r["alone"]["p99_s"],
        "plain_beside_p50_s": r["beside_bombs"]["p50_s"],
        "plain_beside_p99_s": r["beside_bombs"]["p99_s"],
        "p50_ratio": r["beside_bombs"]["p50_s"] / r["alone"]["p50_s"],
        "p99_ratio": r["beside_bombs"]["p99_s"] / r["alone"]["p99_s"],
        "bombs_finished": len(done),
        "bomb_family_sampled_tokens": max((b["usage"]["family_sampled_tokens"] for b in done),
                                          default=None),
        "bomb_descendants": max((b["usage"]["num_children"] for b in done), default=None),
        "bomb_wall_s": max((b["wall_s"] for b in done), default=None),
        "errors": r["alone"]["errors"] + r["beside_bombs"]["errors"]
        + [b["error"] for b in r["bombs"] if b["error"]],
    }


def markdown(rows: list[dict], args, command: str) -> str:
    lines = [
        "# Many users: other users' latency beside fork bombs",
        "",
        f"`{command}`",
        "",
        f"Tiny model on CPU, one `vllm serve` per row, started in the same run; "
        f"{args.clients} clients send plain {PLAIN_TOKENS}-token completions one after "
        f"the other ({args.per_client} each), alone and then beside {args.bombs} "
        f"fork-bombing clients (16 promises, each child 16 more, grandchildren up to "
        f"{LEAF_TOKENS} tokens; `max_tokens` {BOMB_MAX_TOKENS}). `limits off`: fair share "
        f"off, budgets out of reach (the behaviour before family limits); `limits on`: "
        f"the defaults.",
        "",
        "| config | plain p50 alone | p50 beside bombs | × | plain p99 alone | p99 beside bombs | × "
        "| bomb family sampled tokens (max) | descendants | bomb latency |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['config']} | {r['plain_alone_p50_s']:.3f} s | {r['plain_beside_p50_s']:.3f} s "
            f"| {r['p50_ratio']:.1f} | {r['plain_alone_p99_s']:.3f} s "
            f"| {r['plain_beside_p99_s']:.3f} s | {r['p99_ratio']:.1f} "
            f"| {r['bomb_family_sampled_tokens']} | {r['bomb_descendants']} "
            f"| {r['bomb_wall_s'] if r['bomb_wall_s'] is None else round(r['bomb_wall_s'], 1)} s |")
    lines += ["", "The family token budget of `limits on` is (1 + 16) × 1,000 = 17,000 tokens.", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--per-client", type=int, default=10)
    parser.add_argument("--bombs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--out", type=Path,
                        help="directory for many_users.{json,md} (default: print only; "
                             "the published page changes only with --out docs/benchmarks)")
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    from vllm_seqhooks.scripted.processor import encode_script
    from vllm_seqhooks.scripted.tiny_model import build_tiny_model

    workdir = Path(tempfile.mkdtemp(prefix="seqhooks-many-users-"))
    model = str(build_tiny_model(workdir / "tiny"))
    tok = AutoTokenizer.from_pretrained(model)
    S = lambda text: encode_script(tok, text)  # noqa: E731
    rows = []
    raw = {}
    for name, flags in CONFIGS.items():
        srv = start_server(model, *TINY_FLAGS, *TINY_HOOK_FLAGS, *SERVER_FLAGS, *flags,
                           log_path=workdir / f"server-{name.replace(' ', '-')}.log")
        try:
            r = asyncio.run(measure(srv.url, model, S, clients=args.clients,
                                    per_client=args.per_client, bombs=args.bombs,
                                    timeout_s=args.timeout))
        finally:
            srv.stop()
        raw[name] = r
        rows.append(summarize(name, r))
        print(json.dumps(rows[-1], indent=2), flush=True)
    command = ".venv/bin/python -m benchmarks.many_users" + (
        f" --out {args.out}" if args.out else "")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "many_users.json").write_text(json.dumps({"rows": rows, "raw": raw},
                                                             indent=2))
        (args.out / "many_users.md").write_text(markdown(rows, args, command))
        print(f"wrote {args.out / 'many_users.md'} and many_users.json")
    return 0 if not any(r["errors"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
