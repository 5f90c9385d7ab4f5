"""The private vLLM API vllm-seqhooks relies on, in one place.

vLLM's scheduler and model-runner internals are not a public interface.
The engine package uses the names this package lists; :func:`check`
verifies, at import time, that the installed vLLM is the pinned release and
still has each of them with the expected signature, so that a vLLM upgrade
fails loudly at start-up (and in ``tests/test_vllm_private.py``) instead of
misbehaving at run time. The patches that wrap private methods are
implemented here too; they are listed, and installed, by
:mod:`vllm_seqhooks.engine.patches`. One module per side of vLLM:
:mod:`.scheduler`, :mod:`.runner` (the model runners, in worker processes),
:mod:`.input_batch` (the V1 runner's persistent batch permuted in one pass),
:mod:`.cpu_seeds` (seeded split prefills on the V1 CPU runner),
:mod:`.frontend`, and :mod:`.ray_on_cpu` (a test-only switch that lets the CPU
platform run vLLM's Ray executor). The scheduler's side also has
:mod:`.sessions` (parking through vLLM's streaming-input sessions, with the
assumptions it relies on, checked here), :mod:`.scheduler_calls` (the other
private ``Scheduler`` methods the engine's parts call), :mod:`.scheduler_port`
(the one object through which the parts read and act on vLLM's scheduler) and
:mod:`.overrides` (the private ``Scheduler`` methods the hook scheduler
overrides: why, what each relies on, when it can go). No module of the
engine outside this package calls a private vLLM method or touches a
private attribute of a vLLM object (``tests/test_vllm_private.py``).
"""

from __future__ import annotations

from vllm_seqhooks.engine.vllm_private.common import (
    PINNED_VLLM_VERSION,
    VllmPrivateAPIError,
)
from vllm_seqhooks.engine.vllm_private.cpu_seeds import cpu_seed_problems, install_cpu_seed_fix
from vllm_seqhooks.engine.vllm_private.input_batch import (
    input_batch_problems,
    permute_input_batch,
)
from vllm_seqhooks.engine.vllm_private.frontend import (
    input_processor_problems,
    install_per_completion_traces,
    install_request_validator,
    output_processor_problems,
)
from vllm_seqhooks.engine.vllm_private.ray_on_cpu import (
    install_ray_on_cpu,
    ray_on_cpu_problems,
    ray_on_cpu_requested,
)
from vllm_seqhooks.engine.vllm_private.runner import (
    SPLICE_INPUTS_ATTR,
    copy_kv_slots,
    install_family_batch_order,
    install_splice_inputs,
    model_runner_problems,
    runner_kv_caches,
    splice_problems,
    v2_model_runner_problems,
    v2_splice_problems,
)
from vllm_seqhooks.engine.vllm_private.scheduler_calls import (
    stock_request_updates,
    vllm_request_update,
)
from vllm_seqhooks.engine.vllm_private.scheduler_port import SchedulerPort
from vllm_seqhooks.engine.vllm_private.sessions import (
    park_stopped,
    parked_not_waiting,
    session_problems,
)
from vllm_seqhooks.engine.vllm_private.scheduler import (
    adopt_block_hashes,
    allocate_join_blocks,
    children_first_queue,
    hit_with_partial_block,
    salt_block_hashes,
    scheduler_problems,
    share_block_hashes,
    world_cpu_group,
)

__all__ = [
    "PINNED_VLLM_VERSION", "SPLICE_INPUTS_ATTR", "VllmPrivateAPIError", "adopt_block_hashes",
    "allocate_join_blocks",
    "check",
    "children_first_queue", "copy_kv_slots", "hit_with_partial_block", "cpu_seed_problems",
    "input_batch_problems", "input_processor_problems", "permute_input_batch",
    "install_cpu_seed_fix",
    "install_family_batch_order", "install_ray_on_cpu", "ray_on_cpu_problems",
    "ray_on_cpu_requested", "install_per_completion_traces", "install_request_validator",
    "install_splice_inputs", "output_processor_problems",
    "model_runner_problems", "problems", "runner_kv_caches", "salt_block_hashes", "scheduler_problems",
    "world_cpu_group",
    "share_block_hashes",
    "splice_problems", "v2_model_runner_problems", "v2_splice_problems",
    "SchedulerPort", "stock_request_updates", "vllm_request_update",
    "park_stopped", "parked_not_waiting", "session_problems",
]


def problems() -> list[str]:
    """Everything the scheduler's process uses that differs from the pinned
    vLLM (empty when all is well)."""
    import vllm

    found: list[str] = []
    version = getattr(vllm, "__version__", "?")
    if version.split("+")[0] != PINNED_VLLM_VERSION:
        found.append(
            f"vLLM {version} is installed; vllm-seqhooks is pinned to "
            f"{PINNED_VLLM_VERSION}"
        )
    return found + scheduler_problems() + session_problems()


_checked = False


def check() -> None:
    """Raise :class:`VllmPrivateAPIError` listing every mismatch."""
    global _checked
    if _checked:
        return
    found = problems()
    if found:
        raise VllmPrivateAPIError(
            "vllm_seqhooks cannot run on this vLLM:\n  - " + "\n  - ".join(found)
        )
    _checked = True
