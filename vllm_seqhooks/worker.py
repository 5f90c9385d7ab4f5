"""The worker-process side of vllm-seqhooks.

Engines with hooks are started with ``worker_extension_cls`` set to
:class:`SeqHooksWorkerExtension`. vLLM imports it in every worker process
(also the separate ones of tensor/pipeline parallelism) before the model
runner is built, and importing this module installs the family batch order
(:func:`vllm_seqhooks._vllm_private.install_family_batch_order`), which
then applies to the engines whose hooks ask for it. When the user passes a
``worker_extension_cls`` of their own, theirs is kept and the order is
installed by the scheduler, which covers the worker of a single-process
engine.
"""

from __future__ import annotations

from vllm_seqhooks import _vllm_private


class SeqHooksWorkerExtension:
    """Adds nothing to the worker: importing it is what matters."""


_vllm_private.install_family_batch_order()
