"""The KV cache's memory on vLLM's CPU platform when the user sets none.

vLLM's CPU worker reserves ``--gpu-memory-utilization`` (default 0.92) of
the machine's memory and refuses to start when less than that is available
("Available memory on node 0 (13.37/14.71 GiB) on startup is less than
desired CPU memory utilization"), which a few hundred MB used elsewhere is
enough to cause; the embedded models need megabytes. With hooks on and
neither ``kv_cache_memory_bytes``, ``--gpu-memory-utilization`` nor
``VLLM_CPU_KVCACHE_SPACE`` given, an engine whose default would be refused
gets half the memory available at start-up instead (a warning names the
flags that choose). Where vLLM's default fits, nothing changes; GPUs are not
touched.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any, Mapping

logger = logging.getLogger("vllm.seqhooks.cpu_memory")

_MIB = 1 << 20


#: What the processes vLLM starts before its CPU worker checks the memory
#: (EngineCore, the worker's own imports) take from what is available now:
#: 0.85 GiB measured with the embedded model; twice that, for room.
STARTUP_HEADROOM = 2 << 30


def default_kv_cache_bytes(total: int, available: int, utilization: float) -> int | None:
    """The KV cache to give an engine whose user set no memory: None when
    vLLM's own default (``utilization`` of ``total``) will fit what is
    ``available`` when its worker checks (:data:`STARTUP_HEADROOM` less than
    now), else half of ``available`` (whole MiB)."""
    if math.ceil(total * utilization) <= available - STARTUP_HEADROOM:
        return None
    return max(_MIB, available // 2 // _MIB * _MIB)


def cpu_memory_args(args: Mapping[str, Any]) -> dict[str, Any]:
    """``{"kv_cache_memory_bytes": N}`` for engine arguments ``args`` that
    vLLM's CPU platform would refuse for want of memory (see the module doc);
    ``{}`` otherwise."""
    if args.get("kv_cache_memory_bytes") is not None or os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        return {}
    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms import current_platform

    default = EngineArgs.gpu_memory_utilization  # (a value equal to it counts as unset)
    if args.get("gpu_memory_utilization") not in (None, default):
        return {}  # the user's own choice: vLLM's message is about it
    if not current_platform.is_cpu():
        return {}
    total, available = memory_of_first_node()
    chosen = default_kv_cache_bytes(total, available, default)
    if chosen is None:
        return {}
    gib = 1 << 30
    # (a warning: vLLM configures its log handlers only after the arguments are
    # read, and until then Python prints warnings alone)
    logger.warning(
        "vllm-seqhooks: %.2f of %.2f GiB of memory is available on the engine's memory node, "
        "less than vLLM's default gpu_memory_utilization %.2f reserves on CPU; KV cache set "
        "to %.2f GiB instead (set --kv-cache-memory-bytes / kv_cache_memory_bytes, or "
        "--gpu-memory-utilization, to choose)", available / gib, total / gib, default,
        chosen / gib)
    return {"kv_cache_memory_bytes": chosen}


def memory_of_first_node() -> tuple[int, int]:
    """(total, available) bytes of the memory node vLLM's CPU worker checks:
    the NUMA node of the first CPU it may run on (a node can be a third of
    the machine); the whole machine where vLLM has no such helper."""
    try:
        from vllm.utils.cpu_resource_utils import get_allowed_cpu_list, get_memory_node_info

        node = get_memory_node_info(get_allowed_cpu_list()[0].numa_node)
        return int(node.total_memory), int(node.available_memory)
    except (ImportError, AttributeError, IndexError, OSError):
        import psutil

        memory = psutil.virtual_memory()
        return int(memory.total), int(memory.available)
