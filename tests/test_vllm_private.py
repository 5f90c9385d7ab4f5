"""The private vLLM API the engine package relies on
(``vllm_seqhooks/engine/vllm_private/``): present with the expected
signatures on the pinned vLLM, and reported, naming what changed, when it
changes."""

from __future__ import annotations

import pytest


def test_pinned_private_vllm_api_is_present():
    """Fails loudly when vLLM changes under the pin: every private name the
    scheduler and the batch grouping use, with its signature."""
    from vllm_seqhooks.engine import vllm_private

    assert vllm_private.problems() == []
    assert vllm_private.model_runner_problems() == []
    assert vllm_private.input_batch_problems() == []
    assert vllm_private.v2_model_runner_problems() == []
    assert vllm_private.splice_problems() == []
    assert vllm_private.v2_splice_problems() == []
    assert vllm_private.cpu_seed_problems() == []


def test_a_changed_private_api_is_reported(monkeypatch):
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.worker.gpu_input_batch import InputBatch

    from vllm_seqhooks.engine import vllm_private

    monkeypatch.setattr(Scheduler, "_free_request", lambda self, request: None)
    monkeypatch.setattr(InputBatch, "swap_states", lambda self, a, b: None)
    assert any("swap_states" in p for p in vllm_private.input_batch_problems())
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    monkeypatch.setattr(GPUModelRunner, "_bookkeeping_sync", lambda self, *a: None)
    assert any("_bookkeeping_sync" in p for p in vllm_private.cpu_seed_problems())
    from vllm.v1.worker.gpu import model_runner as v2

    monkeypatch.setattr(v2, "sort_batch_req_ids", lambda reqs, drafts: list(reqs))
    monkeypatch.setattr(v2.GPUModelRunner, "prepare_attn", lambda self, batch, extra: None)
    assert any("prepare_attn" in p for p in vllm_private.v2_splice_problems())
    assert any("sort_batch_req_ids" in p for p in vllm_private.v2_model_runner_problems())
    assert any("_free_request" in p for p in vllm_private.problems())
    assert any("swap_states" in p for p in vllm_private.model_runner_problems())
    monkeypatch.setattr(vllm_private, "_checked", False)
    with pytest.raises(vllm_private.VllmPrivateAPIError, match="_free_request"):
        vllm_private.check()


def test_frontend_private_api_is_present():
    from vllm_seqhooks.engine import vllm_private

    assert vllm_private.input_processor_problems() == []
    assert vllm_private.output_processor_problems() == []


def test_a_changed_frontend_api_is_reported(monkeypatch):
    from vllm.v1.engine.input_processor import InputProcessor

    from vllm_seqhooks.engine import vllm_private

    monkeypatch.setattr(InputProcessor, "_validate_params", lambda self, params: None)
    assert any("_validate_params" in p for p in vllm_private.input_processor_problems())


def test_a_changed_output_processor_is_reported(monkeypatch):
    from vllm.v1.engine.output_processor import RequestState

    from vllm_seqhooks.engine import vllm_private

    monkeypatch.setattr(RequestState, "make_request_output",
                        lambda self, new_token_ids, pooling_output, finish_reason: None)
    found = vllm_private.output_processor_problems()
    assert any("make_request_output" in p for p in found)


def test_ray_on_cpu_switch_api_is_present_and_checked(monkeypatch):
    """What the test-only Ray switch patches (vllm_private/ray_on_cpu.py)
    exists under the pin, and a change is reported by name."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[ray]')")
    from vllm.v1.executor import ray_executor_v2

    from vllm_seqhooks.engine import vllm_private

    assert vllm_private.ray_on_cpu_problems() == []
    monkeypatch.setattr(ray_executor_v2.RayExecutorV2, "_get_actor_resource_kwargs",
                        lambda self: {})
    monkeypatch.delattr(ray_executor_v2.RayWorkerProc, "get_node_and_physical_gpu_ids")
    found = vllm_private.ray_on_cpu_problems()
    assert any("_get_actor_resource_kwargs" in p for p in found)
    assert any("get_node_and_physical_gpu_ids" in p for p in found)
