"""Shared pytest fixtures: the tiny offline model and engine settings."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from vllm_seqhooks.testing.tiny_model import TINY_ENGINE_KWARGS as TINY_LLM_KWARGS  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Path (str) of the tiny random Llama model, built once per session."""
    from vllm_seqhooks.testing.tiny_model import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny_model") / "model"))


@pytest.fixture(scope="session")
def tiny_llm_kwargs(tiny_model_dir: str) -> dict[str, Any]:
    """``vllm.LLM`` keyword arguments for the tiny model (copy before editing)."""
    return dict(model=tiny_model_dir, **TINY_LLM_KWARGS)


@pytest.fixture(autouse=True)
def _live_vllm_envs():
    """vLLM caches its environment variables once an in-process EngineCore
    starts (``vllm.envs.enable_envs_cache``); tests switch
    ``VLLM_ENABLE_V1_MULTIPROCESSING`` between engines, so read them live."""
    envs = sys.modules.get("vllm.envs")
    if envs is not None and hasattr(envs, "disable_envs_cache"):
        envs.disable_envs_cache()
    yield


@pytest.fixture(autouse=True)
def _no_stale_cpu_tp_segments():
    """vLLM's CPU tensor-parallel backend leaves its shared-memory segments
    in /dev/shm when its workers are killed; a later engine given the same
    port then fails to start (errno 17). Remove those no process maps."""
    from vllm_seqhooks.testing.cpu_shm import remove_stale_cpu_shm

    remove_stale_cpu_shm()
    yield


@pytest.fixture(params=["compiled", "python"])
def kernels(request, monkeypatch) -> str:
    """Run a test with the compiled kernels of the family batch order
    (``vllm_seqhooks.native``) and again with their Python implementations.
    The compiled run fails when they are not built, unless SEQHOOKS_NATIVE=0
    asks for the Python ones (then it is skipped)."""
    from vllm_seqhooks import native

    if request.param == "python":
        monkeypatch.setattr(native, "rows", None)
    elif native.rows is None:
        if native.why_not == f"{native.ENV}=0":
            pytest.skip(native.why_not)
        pytest.fail(f"the compiled kernels are missing: {native.why_not}")
    return request.param
