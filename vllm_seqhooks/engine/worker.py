"""The worker-process side of vllm-seqhooks.

Engines with hooks are started with ``worker_extension_cls`` set to
:class:`SeqHooksWorkerExtension`. vLLM imports it in every worker process
(also the separate ones of tensor/pipeline parallelism) before the model
runner is built, and importing this module installs the worker patches
(:func:`vllm_seqhooks.engine.patches.install_worker_patches`: the family
batch order), which then apply to the engines whose hooks ask for them. When
the user passes a ``worker_extension_cls`` of their own, theirs is kept and
the scheduler installs the patches, which covers the worker of a
single-process engine.
"""

from __future__ import annotations

from vllm_seqhooks.engine import patches


class SeqHooksWorkerExtension:
    """Adds nothing to the worker: importing it is what matters."""


patches.install_worker_patches()
