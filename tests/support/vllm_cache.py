"""Test-only: one vLLM cache directory per vLLM release, for every process
the tests start (``VLLM_CACHE_ROOT``, set once by ``tests/conftest.py``).

Why: vLLM caches what it learns about a model class by inspecting it in a
subprocess (``vllm/model_executor/models/registry.py``,
``_LazyRegisteredModel.inspect_model_cls``: ``$VLLM_CACHE_ROOT/modelinfos``,
keyed by the model file's hash only). vLLM 0.33 cannot read the entry 0.32
writes, and the reverse ("Cached model info ... error"), so the suite's two
lanes (0.32 and 0.33, side by side) overwrote each other's entry all run
long: 25 engine start-ups paid the subprocess, about 7 CPU-seconds each
(measured 2026-11-28 with a per-process CPU sampler over ``scripts/test.sh``,
166 CPU-seconds of 2,648). And the tests that point ``XDG_CACHE_HOME`` at a
temporary directory (to see what a script writes into the project's user
cache) moved vLLM's default cache there too, so their engines missed it as
well. Pinning the variable before any test runs gives each release its own
directory, which every process inherits whatever ``XDG_CACHE_HOME`` it is
given. A variable the caller set is kept.
"""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from vllm_seqhooks.tasks import cache_dir

ENV_VAR = "VLLM_CACHE_ROOT"


def per_release_dir() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/vllm-seqhooks/test-vllm-cache/<vllm version>``."""
    try:
        release = version("vllm")
    except PackageNotFoundError:
        release = "none"
    return cache_dir("test-vllm-cache", release)


def pin_vllm_cache_root() -> None:
    """Set ``VLLM_CACHE_ROOT`` to :func:`per_release_dir` unless it is set."""
    os.environ.setdefault(ENV_VAR, str(per_release_dir()))
