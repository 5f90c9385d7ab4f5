"""Test-only: let vLLM's CPU platform run the Ray executor and Ray data
parallelism, with Ray's ``CPU`` resource standing in for a device.

vLLM 0.32's CPU platform declares no Ray device key
(``Platform.ray_device_key`` is ``""``), so ``initialize_ray_cluster``
(``vllm/v1/executor/ray_utils.py``) and ``CoreEngineActorManager``
(``vllm/v1/engine/utils.py``) refuse it. With ``SEQHOOKS_TEST_RAY_ON_CPU=1``
the tests' own ``vllm.general_plugins`` entry point, :func:`register`
(loaded in every vLLM process whose ``sys.path`` holds :data:`PLUGIN_DIR`,
which ``tests/conftest.py`` puts on ``PYTHONPATH``), calls
:func:`install_ray_on_cpu`; without the variable nothing changes. It exists
so that hooks can be tested on vLLM's multi-node machinery on machines
without GPUs; it is not a way to serve on CPUs, and it is not in the wheel.

Four things stand between the CPU platform and Ray, each handled here:

- the device key: ``CpuPlatform.ray_device_key`` becomes ``"CPU"``, so
  placement groups reserve one Ray CPU per worker (``--num-cpus`` of
  ``ray start`` is the number of "devices" a node has);
- ``RayExecutorV2._get_actor_resource_kwargs`` asks for
  ``resources={"CPU": n}``, which Ray refuses (``num_cpus`` is the keyword
  for CPUs): the worker actors take no resources of their own, their
  placement group bundle holds the CPU;
- ``RayWorkerProc.get_node_and_physical_gpu_ids`` reads Ray's accelerator
  ids, which have no ``CPU`` entry (CPUs are not accelerators), and runs
  before the worker loads vLLM plugins: the executor starts
  :class:`CpuRayWorkerProc` instead, which reports no device ids (the CPU
  worker binds cores by its local rank, not by device id);
- Ray data parallelism gives each rank a placement group of its devices
  plus one ``{"CPU": 1}`` bundle for the engine actor, which the ``CPU``
  device key would count as one more device (the executor then waits
  forever for a reader that never comes): the executor's
  ``get_bundles_sorted_by_node`` leaves that bundle out.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

ENV_VAR = "SEQHOOKS_TEST_RAY_ON_CPU"
#: A directory holding only the metadata of a distribution whose
#: ``vllm.general_plugins`` entry point is :func:`register`: on ``sys.path``,
#: vLLM loads it like any installed plugin.
PLUGIN_DIR = Path(__file__).resolve().with_name("ray_plugin")
RAY_CPU_KEY = "CPU"
_MARK = "_seqhooks_ray_on_cpu"


def register() -> None:
    """The tests' ``vllm.general_plugins`` entry point: the switch, when
    ``SEQHOOKS_TEST_RAY_ON_CPU=1``."""
    if ray_on_cpu_requested() and not install_ray_on_cpu():
        logging.getLogger("vllm.seqhooks.tests").warning(
            "SEQHOOKS_TEST_RAY_ON_CPU=1 ignored: not vLLM's CPU platform, or Ray is not installed")


def ray_on_cpu_requested() -> bool:
    return os.environ.get(ENV_VAR, "") == "1"


def ray_on_cpu_problems() -> list[str]:
    """What the switch relies on that the installed vLLM lacks."""
    found = []
    try:
        from vllm.platforms.cpu import CpuPlatform
        from vllm.v1.executor import ray_executor_v2
    except ImportError as exc:  # Ray not installed
        return [f"vLLM's Ray executor cannot be imported: {exc}"]
    if getattr(CpuPlatform, "ray_device_key", None) is None:
        found.append("CpuPlatform.ray_device_key is missing")
    worker = getattr(ray_executor_v2, "RayWorkerProc", None)
    if worker is None or not hasattr(worker, "get_node_and_physical_gpu_ids"):
        found.append("ray_executor_v2.RayWorkerProc.get_node_and_physical_gpu_ids is missing")
    if not callable(getattr(ray_executor_v2, "get_bundles_sorted_by_node", None)):
        found.append("ray_executor_v2.get_bundles_sorted_by_node is missing")
    executor = getattr(ray_executor_v2, "RayExecutorV2", None)
    if executor is None or not isinstance(
            executor.__dict__.get("_get_actor_resource_kwargs"), staticmethod):
        found.append("RayExecutorV2._get_actor_resource_kwargs is not a staticmethod")
    return found


def install_ray_on_cpu() -> bool:
    """Install the switch (once). False when the current platform is not
    vLLM's CPU platform or Ray is not installed; raises
    :class:`VllmPrivateAPIError` when vLLM lacks what it patches."""
    from vllm.platforms import current_platform
    from vllm.platforms.cpu import CpuPlatform

    if not current_platform.is_cpu():
        return False
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    found = ray_on_cpu_problems()
    if found:
        from vllm_seqhooks.engine.vllm_private.common import VllmPrivateAPIError

        raise VllmPrivateAPIError("SEQHOOKS_TEST_RAY_ON_CPU: " + "; ".join(found))
    from vllm.v1.executor import ray_executor_v2

    CpuPlatform.ray_device_key = RAY_CPU_KEY
    executor = ray_executor_v2.RayExecutorV2
    if not getattr(executor._get_actor_resource_kwargs, _MARK, False):
        def _get_actor_resource_kwargs() -> dict:
            return {"num_gpus": 0}

        setattr(_get_actor_resource_kwargs, _MARK, True)
        executor._get_actor_resource_kwargs = staticmethod(_get_actor_resource_kwargs)
    ray_executor_v2.RayWorkerProc = _cpu_worker_class()
    sorted_bundles = ray_executor_v2.get_bundles_sorted_by_node
    if not getattr(sorted_bundles, _MARK, False):
        def get_bundles_sorted_by_node(placement_group):
            found = sorted_bundles(placement_group)
            control = _dp_control_bundle(placement_group)
            return [b for b in found if b[0] != control]

        setattr(get_bundles_sorted_by_node, _MARK, True)
        ray_executor_v2.get_bundles_sorted_by_node = get_bundles_sorted_by_node
    return True


def _dp_control_bundle(placement_group) -> int | None:
    """The bundle of a data-parallel rank's placement group that holds its
    engine actor (the last one, ``{"CPU": 1}``: ``create_dp_placement_groups``
    in vllm/v1/engine/utils.py), which the ``CPU`` device key would
    otherwise count as a device."""
    import ray

    table = ray.util.placement_group_table(placement_group)
    if not str(table.get("name", "")).startswith("dp_rank_"):
        return None
    return len(placement_group.bundle_specs) - 1


def _cpu_worker_class() -> type:
    global CpuRayWorkerProc
    if CpuRayWorkerProc is None:
        from vllm.v1.executor.ray_executor_v2 import RayWorkerProc

        class _CpuRayWorkerProc(RayWorkerProc):
            """vLLM's Ray worker, reporting no device ids on CPU."""

            def get_node_and_physical_gpu_ids(self) -> tuple[str, list[int]]:
                import ray

                return ray.get_runtime_context().get_node_id(), []

        _CpuRayWorkerProc.__name__ = _CpuRayWorkerProc.__qualname__ = "CpuRayWorkerProc"
        CpuRayWorkerProc = _CpuRayWorkerProc
    return CpuRayWorkerProc


CpuRayWorkerProc = None
if ray_on_cpu_requested():  # a Ray worker unpickling CpuRayWorkerProc imports this module
    try:
        _cpu_worker_class()
    except ImportError:
        pass
