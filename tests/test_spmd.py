"""SPMD engines (issue 23 item 3): under ``external_launcher`` every rank
runs its own hook scheduler on the same requests, and vLLM requires that
they decide alike (their model runners meet in collective calls)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

#: Trace fields that are wall-clock times (each rank reads its own clock).
TIME_FIELDS = {"time", "spawn_time", "finish_time", "join_time"}


def _decisions(value):
    """A trace without its wall-clock times and with request ids reduced to
    the family-local part (vLLM's ``LLM`` suffixes each request id with a
    random string per process)."""
    if isinstance(value, dict):
        return {k: (v.split("-", 1)[0] + v[v.find("@"):] if k == "request_id" and "@" in v
                    else v.split("-", 1)[0] if k == "request_id" else _decisions(v))
                for k, v in value.items() if k not in TIME_FIELDS}
    if isinstance(value, list):
        return [_decisions(v) for v in value]
    return value


@pytest.mark.slow
def test_two_ranks_take_the_same_decisions(tmp_path):
    """Two ranks under ``torchrun`` (tensor parallel over them, hooks on, 24
    families on 16 slots): answers and traces (every spawn, join position,
    merged token, usage and limit) are identical on both ranks, and the model
    forked; a request with a timeout is refused on both, naming why."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("two ranks need two CPUs")
    env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND=f"{cpus[0]}|{cpus[1]}")
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    done = subprocess.run([torchrun, "--nproc-per-node", "2", "-m",
                           "vllm_seqhooks.testing.spmd_rank", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    answers = [[(text, _decisions(trace)) for text, trace in r["answers"]] for r in ranks]
    assert answers[0] == answers[1]
    assert sum(len(trace["children"]) for _, trace in answers[0] if trace) >= 20
    for r in ranks:
        assert "seqhooks_family_timeout_s" in r["refused"] and "SPMD" in r["refused"]


def _config(backend):
    return SimpleNamespace(parallel_config=SimpleNamespace(distributed_executor_backend=backend))


def test_timeouts_are_refused_on_spmd_engines_only():
    from vllm_seqhooks.engine.engine_support import unsupported_settings

    timed = SimpleNamespace(child_timeout_s=2.0, family_timeout_s=None)
    plain = SimpleNamespace(child_timeout_s=None, family_timeout_s=None)
    why = unsupported_settings(_config("external_launcher"), timed)
    assert "child_timeout_s" in why and "external_launcher" in why
    assert unsupported_settings(_config("external_launcher"), plain) is None
    assert unsupported_settings(_config("mp"), timed) is None
    assert unsupported_settings(_config(None), None) is None


def test_per_request_timeouts_are_refused_on_spmd_engines_only():
    from vllm import SamplingParams

    from vllm_seqhooks.engine.validation import check_request

    timed = SamplingParams(extra_args={"seqhooks_child_timeout_s": 3})
    check_request(timed)
    with pytest.raises(ValueError, match="seqhooks_child_timeout_s.*SPMD"):
        check_request(timed, spmd=True)
    check_request(SamplingParams(extra_args={"seqhooks_child_max_tokens": 3}), spmd=True)
