"""The private vLLM API vllm-seqhooks relies on, in one place.

vLLM's scheduler and model-runner internals are not a public interface.
The engine package uses the names this package lists; :func:`check`
verifies, at import time, that the installed vLLM is a supported release
(:mod:`.releases`, where each difference between releases is named) and
has each of them with the signature that release is expected to have, so that a vLLM upgrade
fails loudly at start-up (and in ``tests/test_vllm_private.py``) instead of
misbehaving at run time. The patches that wrap private methods are
implemented here too; they are listed, and installed, by
:mod:`vllm_seqhooks.engine.patches`. One module per side of vLLM:
:mod:`.scheduler`, :mod:`.runner` (the model runners, in worker processes),
:mod:`.input_batch` (the V1 runner's persistent batch permuted in one pass),
:mod:`.cpu_seeds` (seeded split prefills on the V1 CPU runner),
and :mod:`.frontend`. The scheduler's side also has
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

from vllm_seqhooks.engine.vllm_private.common import VllmPrivateAPIError
from vllm_seqhooks.engine.vllm_private.releases import (
    RELEASES,
    SUPPORTED_VERSIONS,
    Release,
    installed_version,
)
from vllm_seqhooks.engine.vllm_private.cpu_seeds import cpu_seed_problems, install_cpu_seed_fix
from vllm_seqhooks.engine.vllm_private.input_batch import (
    input_batch_problems,
    permute_input_batch,
)
from vllm_seqhooks.engine.vllm_private.frontend import (
    input_processor_problems,
    install_per_completion_traces,
    install_beam_search_refusal,
    beam_search_problems,
    install_request_validator,
    output_processor_problems,
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
    count_as_rejected,
    request_update_for_hooks,
    bind_stock_request_updates,
    vllm_request_update,
)
from vllm_seqhooks.engine.vllm_private.scheduler_port import SchedulerPort
from vllm_seqhooks.engine.vllm_private.sessions import (
    park_stopped,
    parked_not_waiting,
    session_problems,
    unqueue_parked,
)
from vllm_seqhooks.engine.vllm_private.scheduler import (
    adopt_block_hashes,
    allocate_join_blocks,
    children_first_queue,
    hash_lookahead_tokens,
    hit_with_partial_block,
    salt_block_hashes,
    scheduler_problems,
    share_block_hashes,
    world_cpu_group,
)

__all__ = [
    "RELEASES", "Release", "SUPPORTED_VERSIONS", "installed_version", "SPLICE_INPUTS_ATTR", "VllmPrivateAPIError", "adopt_block_hashes",
    "allocate_join_blocks",
    "check",
    "children_first_queue", "hash_lookahead_tokens", "copy_kv_slots", "hit_with_partial_block", "cpu_seed_problems",
    "input_batch_problems", "input_processor_problems", "permute_input_batch",
    "install_cpu_seed_fix",
    "install_family_batch_order", "install_per_completion_traces", "install_beam_search_refusal",
    "beam_search_problems", "install_request_validator",
    "install_splice_inputs", "output_processor_problems",
    "model_runner_problems", "problems", "runner_kv_caches", "salt_block_hashes", "scheduler_problems",
    "world_cpu_group",
    "share_block_hashes",
    "splice_problems", "v2_model_runner_problems", "v2_splice_problems",
    "SchedulerPort", "count_as_rejected", "request_update_for_hooks", "bind_stock_request_updates",
    "vllm_request_update", "park_stopped", "parked_not_waiting", "session_problems",
    "unqueue_parked",
]


def problems() -> list[str]:
    """Everything the scheduler's process uses that differs from what the
    installed vLLM release is expected to have (empty when all is well); a
    release that is not supported is reported alone."""
    from vllm_seqhooks.engine.vllm_private.releases import version_problem

    version = installed_version()
    release = RELEASES.get(version)
    if release is None:
        return [version_problem(version)]
    return scheduler_problems(release) + session_problems(release)


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
