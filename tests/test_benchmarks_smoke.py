"""Smoke run of every benchmark workload (``python -m benchmarks --smoke``):
the smallest sizes on the tiny model, one repeat. No timing assertions: the
structure of the results and the invariants that must hold on any machine
(same tokens everywhere; engine counters positive; native never prefills more
than the client loop; engine steps equal to the critical path).

Over 60 s: it runs three commands as a user types them
(``python -m benchmarks --smoke``, ``benchmarks.splice --smoke``,
``benchmarks.rollout --smoke``), each a process of its own that imports
torch and vLLM (about 9 CPU seconds each); the rollout one starts two
``vllm serve`` (each an API process and an engine process, both importing
vLLM). About 80 CPU seconds in all (2026-11-28), most of it those imports.
Each command's own engines run in-process, each created once and reused by
the workloads that need it; a smoke run leaves them to the process's exit
(``benchmarks.common.leave_engines_to_exit``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


#: What ``python -m benchmarks --smoke`` writes.
SMOKE_FILES = ("results-smoke.json", "results-smoke.md", "forkjoin-smoke.png")


@pytest.fixture(scope="module")
def bench_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The benchmarks' ``--cache-dir``: the tiny model is built once for the
    module (``benchmarks.common.bench_model``), not once per command."""
    return tmp_path_factory.mktemp("bench-models")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory, bench_models: Path) -> tuple[dict, Path]:
    """The smoke run as a user types it (no ``--out``), with the user cache
    in a temporary directory: its results go there, not to docs/."""
    xdg = tmp_path_factory.mktemp("xdg-cache")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--smoke", "--cache-dir", str(bench_models)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "XDG_CACHE_HOME": str(xdg)},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    out = xdg / "vllm-seqhooks" / "benchmarks"
    assert f"wrote {out / 'results-smoke.md'}" in proc.stdout, proc.stdout[-3000:]
    return json.loads((out / "results-smoke.json").read_text()), out


def test_smoke_writes_nothing_into_docs(smoke):
    for name in SMOKE_FILES:
        assert not (ROOT / "docs" / "benchmarks" / name).exists(), name
        assert not (ROOT / name).exists(), name


def test_outputs_written(smoke):
    results, out = smoke
    md = (out / "results-smoke.md").read_text()
    for heading in ("## 1. Overhead", "## 2. Fork/join", "## 3. Parallel", "## 4. KV memory"):
        assert heading in md
    env = results["environment"]
    assert env["command"].startswith("python -m benchmarks --smoke")
    assert env["vllm"] and env["date"] and env["cpu"]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (out / "forkjoin-smoke.png").stat().st_size > 10_000


def test_overhead(smoke):
    o = smoke[0]["workloads"]["overhead"]
    assert set(o["configs"]) == {"stock", "stock_b", "off", "hooks"}
    for c in o["configs"].values():
        assert c["same_tokens"]
        assert c["tokens_per_s"]["median"] > 0
    assert set(o["ratios"]) >= {"stock_b/stock", "off/stock", "hooks/stock"}


def test_forkjoin_native_vs_loops(smoke):
    fj = smoke[0]["workloads"]["forkjoin"]
    (point,) = fj["points"]
    configs = point["configs"]
    assert set(configs) == {"native", "loop", "eager", "lockstep", "arrival"}
    for name, c in configs.items():
        assert c["correct"], name  # the same tokens as the script, everywhere
        assert c["prefill_tokens"] > 0 and c["decode_tokens"] > 0 and c["steps"] > 0
    native = configs["native"]
    for name in ("loop", "eager", "lockstep"):
        other = configs[name]
        # Both sides sample the same tokens ...
        assert native["decode_tokens"] == other["decode_tokens"], name
        # ... and native never prefills more, nor takes more steps.
        assert native["prefill_tokens"] <= other["prefill_tokens"], name
        assert native["steps"] <= other["steps"], name
    # At joins native prefills only <sync> and the merged tokens.
    shape = {**fj["shape"], **{k: point[k] for k in ("k", "batch")}}
    merged = shape["k"] * shape["child_tokens"] + (shape["k"] - 1)  # "\n" separators
    assert native["join_prefill_tokens"] == shape["batch"] * (merged + 1)
    assert native["join_prefill_tokens"] <= configs["loop"]["join_prefill_tokens"]
    assert native["joins"] == shape["batch"]
    assert native["children_spawned"] == shape["batch"] * shape["k"]
    # The loop prefilled the merged tokens too, plus its partial last block.
    assert configs["loop"]["join_prefill_tokens"] >= native["join_prefill_tokens"]
    assert native["peak_parked_blocks"] > 0 and configs["loop"]["peak_parked_blocks"] == 0
    r = point["ratios"]["native/loop"]
    assert 0 < r["prefill_tokens"]["median"] <= 1
    # The batch order changes where requests sit in the batch, not what is computed.
    arrival = configs["arrival"]
    for key in ("prefill_tokens", "decode_tokens", "steps", "join_prefill_tokens"):
        assert arrival[key] == native[key], key


def test_parallel_steps_follow_the_critical_path(smoke):
    (p,) = smoke[0]["workloads"]["parallel"]["points"]
    assert p["correct"]
    assert p["critical_path"]["ratio"] > 1
    # One family, short prompt: every child starts right after its
    # </promise>, so the engine takes exactly the critical-path steps.
    assert p["forked_steps"]["median"] == p["critical_path"]["forked"]
    assert p["sequential_steps"]["median"] == p["critical_path"]["sequential"]


def test_memory(smoke):
    m = smoke[0]["workloads"]["memory"]
    for part in ("ample", "tight"):
        for name in ("native", "loop"):
            assert m[part][name]["correct"], (part, name)
            assert m[part][name]["peak_blocks_in_use"] > 0
    assert m["ample"]["native"]["peak_parked_blocks"] > 0
    assert m["tight"]["native"]["kv_blocks"] < m["ample"]["native"]["peak_blocks_in_use"]
    assert m["tight"]["native"]["peak_blocks_in_use"] <= m["tight"]["native"]["kv_blocks"]


def test_splice_benchmark(tmp_path, bench_models):
    """``python -m benchmarks.splice --smoke``: every join gives the same
    tokens; with room for every family a splice join prefills only the
    suffix and computes fewer tokens than a re-prefill join or the client
    loop (which compute the same). The minimum counts each path's start
    once per path; paths share positions, so a later child may find the
    first one's start in the prefix cache and splice compute a little
    less (never much less)."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.splice", "--smoke", "--out", str(tmp_path),
         "--cache-dir", str(bench_models)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    result = json.loads((tmp_path / "splice.json").read_text())
    rows = {row["workload"]: row for row in result["rows"]}
    assert set(rows) == {"forkjoin", "kv_pressure"}
    assert all(row["same_tokens"] for row in rows.values())
    ample = rows["forkjoin"]
    splice, reprefill, loop = ample["splice"], ample["reprefill"], ample["loop"]
    assert splice["splice_fallbacks"] == 0
    suffix = len("\n<Conclusion>\n")  # the tiny model's tokenizer: a token per character
    assert splice["join_prefill_tokens"] == suffix * result["size"]["batch"]
    assert 0.95 * splice["minimum_tokens"] <= splice["computed_tokens"] < reprefill["computed_tokens"]
    assert reprefill["computed_tokens"] == loop["computed_tokens"]
    assert (tmp_path / "splice.md").read_text().count("| splice |") == 2


def test_rollout_benchmark(tmp_path):
    """``python -m benchmarks.rollout --smoke``: GRPO groups from the trained
    ThreadWeaver model, native (n per request) against the format's client
    loop (each prompt n times), in-process and over HTTP. Every configuration
    answers every prompt with n completions and samples tokens; the model's
    real behaviour on both sides (it sorts); both sides count the same sampled
    tokens for the same greedy families; logprobs are returned when asked."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.rollout", "--smoke", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    result = json.loads((tmp_path / "rollout.json").read_text())
    n = result["size"]["n"]
    for part in ("in_process", "http"):
        configs = result[part]["configs"]
        assert set(configs) >= {"loop", "loop_b", "native", "native_nolp", "loop_nolp"}
        for name, c in configs.items():
            assert c["completions_per_prompt"] == [n, n], (part, name)
            assert c["sampled_tokens"]["min"] > 0 and c["tokens_per_s"]["min"] > 0
            assert c["reward"] >= 0.5, (part, name, c["reward"])
        assert "A/A control: loop_b / loop" in result[part]["pairs"]
    check = result["in_process"]["count_check"]
    assert check["same_tokens"] > 0 and check["same_count_where_same_tokens"]
    assert result["in_process"]["configs"]["native"]["logprobs_as_asked"]
    assert result["in_process"]["configs"]["native_nolp"]["logprobs_as_asked"]
    md = (tmp_path / "rollout.md").read_text()
    assert "A/A control" in md and "## Over HTTP" in md and "lscpu" in md
