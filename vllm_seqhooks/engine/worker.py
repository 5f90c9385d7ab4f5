"""The worker-process side of vllm-seqhooks.

Engines with hooks are started with ``worker_extension_cls`` set to
:class:`SeqHooksWorkerExtension`. vLLM imports it in every worker process
(also the separate ones of tensor/pipeline parallelism) before the model
runner is built. On a vLLM release that calls a worker extension's
``init_worker_extension`` (0.33), that hook installs the worker patches
(:func:`vllm_seqhooks.engine.patches.install_worker_patches`: the family
batch order) in each worker; on one that does not (0.32), importing this
module installs them. They then apply to the engines whose hooks ask for
them. When the user passes a ``worker_extension_cls`` of their own, theirs
is kept and the scheduler installs the patches, which covers the worker of a
single-process engine.
"""

from __future__ import annotations

from vllm_seqhooks.engine import patches
from vllm_seqhooks.engine.vllm_private.releases import installed


class SeqHooksWorkerExtension:
    """Adds no method for ``collective_rpc``; sets the worker up."""

    def init_worker_extension(self) -> None:
        """Called by vLLM (0.33 and later) in each worker after its device
        and distributed set-up, before the model is loaded."""
        patches.install_worker_patches()


if not installed().calls_worker_extension_init:
    patches.install_worker_patches()
