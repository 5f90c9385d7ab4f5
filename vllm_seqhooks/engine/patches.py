"""Every patch this package makes to vLLM's classes, and the one place that
installs them.

vLLM has no extension point for these; each wraps one function, is
installed at most once per process, leaves engines without hooks untouched,
and fails loudly (or, where stock engines share the process, logs) when the
pinned vLLM lacks what it wraps (:mod:`.vllm_private` checks the names).
The private ``Scheduler`` methods the hook scheduler overrides (a subclass,
not a patch) are the other half of this table:
:data:`.vllm_private.overrides.OVERRIDES`, each with why, what it relies on
and when it can go.

=====================  ==========================================================
patch                  what, why, when installed, when it can go
=====================  ==========================================================
``serve_flags``        ``EngineArgs.add_cli_args``: every parser that takes
                       engine arguments gets the hook flags
                       (:mod:`vllm_seqhooks.engine.serve_flags`). Installed by the
                       ``vllm.general_plugins`` entry point in every vLLM
                       process. Can go when vLLM lets plugins add CLI flags.
``request_validation`` ``InputProcessor._build_logits_processors_params_validator``:
                       the frontend checks each request's hook settings where
                       vLLM checks sampling parameters (HTTP 400, not an engine
                       error; :mod:`.validation`); and
                       ``InputProcessor.process_inputs``: a multimodal prompt
                       with hooks on is refused there. Installed by the entry point
                       when the frontend's module is imported, and by
                       ``vllm_seqhooks.LLM``. Can go when vLLM gives the
                       scheduler (or a plugin) a per-request admission check.
``completion_traces``  ``RequestState.make_request_output``: with ``n`` > 1
                       the answer carries each completion's hook trace, not
                       only the last finished one's
                       (``kv_transfer_params["seqhooks_traces"]``). Installed
                       like ``request_validation``. Can go when vLLM keeps
                       each completion's ``kv_transfer_params``.
``beam_search``        ``BeamSearchOfflineMixin.beam_search`` (``LLM.beam_search``)
                       and ``BeamSearchOnlineMixin.beam_search`` (the OpenAI
                       server's ``use_beam_search``): refused with an error for
                       an engine with hooks (their one-token step requests would
                       spawn children nobody joins). Installed like
                       ``request_validation``. Can go when vLLM's beam search
                       runs whole requests, or hooks score joined beams.
``family_batch_order`` ``GPUModelRunner._may_reorder_batch`` (V1 model runner):
                       each fork/join family is contiguous in the persistent
                       batch (:mod:`vllm_seqhooks.core.batch_order`). Installed
                       by importing the worker extension (:mod:`.worker`) in
                       each worker process, or by the scheduler when the user
                       replaced the worker extension. The V2 runner needs no
                       patch (the scheduler orders its output). Can go with
                       the V1 runner.
``splice_inputs``      ``GPUModelRunner._prepare_inputs`` (V1) and
                       ``prepare_inputs`` / ``prepare_attn`` (V2): the KV
                       copies and position shifts a step's scheduler output
                       carries for splice joins
                       (:mod:`vllm_seqhooks.core.splice_inputs`), applied
                       before the forward pass and after the slot mapping.
                       Installed with the family batch order. Nothing to do
                       in a step without any. Can go when vLLM lets a
                       scheduler give requests position offsets and copy KV.
=====================  ==========================================================
"""

from __future__ import annotations

import functools
import logging

from vllm_seqhooks.engine.vllm_private.frontend import BEAM_SEARCH

logger = logging.getLogger("vllm.seqhooks.plugin")

_SERVE_FLAGS_MARK = "_seqhooks_wrapped"


def install_plugin_patches() -> None:
    """What the ``vllm.general_plugins`` entry point installs (every vLLM
    process, early; importing vLLM's frontend there would cost each worker
    about a second, so the request check waits for its module)."""
    from vllm_seqhooks.engine.post_import import when_imported

    when_imported("vllm.v1.engine.input_processor", _install_request_validation_logged)
    when_imported("vllm.v1.engine.output_processor", _install_completion_traces_logged)
    for module, _name in BEAM_SEARCH:
        when_imported(module, functools.partial(_install_beam_search_refusal_logged, module))
    _install_serve_flags()


def install_frontend_patches() -> None:
    """What a frontend that starts engines with hooks needs
    (``vllm_seqhooks.LLM``): the request check and per-completion traces.
    Raises :class:`~.vllm_private.VllmPrivateAPIError` when one cannot be
    installed."""
    from vllm_seqhooks.engine import vllm_private

    vllm_private.install_request_validator()
    vllm_private.install_per_completion_traces()
    vllm_private.install_beam_search_refusal()


def install_worker_patches() -> bool:
    """What a process running a model needs: the family batch order, the
    splice inputs, and seeded split prefills on CPU. False (logged) when
    the installed vLLM lacks what one of them wraps."""
    from vllm_seqhooks.engine import vllm_private

    ordered = vllm_private.install_family_batch_order()
    seeded = vllm_private.install_cpu_seed_fix()
    return vllm_private.install_splice_inputs() and ordered and seeded


def _install_request_validation_logged() -> None:
    from vllm_seqhooks.engine import vllm_private

    try:
        vllm_private.install_request_validator()
    except vllm_private.VllmPrivateAPIError as exc:
        # Stock engines in this process must keep working; an engine with
        # hooks fails its own version check at start-up.
        logger.error("%s", exc)


def _install_completion_traces_logged() -> None:
    from vllm_seqhooks.engine import vllm_private

    try:
        vllm_private.install_per_completion_traces()
    except vllm_private.VllmPrivateAPIError as exc:
        logger.error("%s", exc)  # (as for the request check)


def _install_beam_search_refusal_logged(module: str) -> None:
    from vllm_seqhooks.engine import vllm_private

    try:
        vllm_private.install_beam_search_refusal(module)
    except vllm_private.VllmPrivateAPIError as exc:
        logger.error("%s", exc)  # (as for the request check)


def _install_serve_flags() -> None:
    from vllm.engine.arg_utils import EngineArgs

    from vllm_seqhooks.engine.serve_flags import add_hook_arguments

    current = EngineArgs.__dict__["add_cli_args"]
    func = current.__func__ if isinstance(current, staticmethod) else current
    if getattr(func, _SERVE_FLAGS_MARK, False):
        return

    @functools.wraps(func)
    def add_cli_args(parser, *args, **kwargs):
        parser = func(parser, *args, **kwargs)
        return add_hook_arguments(parser)

    setattr(add_cli_args, _SERVE_FLAGS_MARK, True)
    EngineArgs.add_cli_args = staticmethod(add_cli_args)  # type: ignore[method-assign]
