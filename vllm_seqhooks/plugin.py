"""The ``vllm.general_plugins`` entry point of vllm-seqhooks.

vLLM calls :func:`register` once per process (API server, EngineCore and
worker processes) before it builds its argument parser. It installs the
patches listed in :mod:`vllm_seqhooks.engine.patches`: the ``vllm serve``
hook flags (:mod:`vllm_seqhooks.engine.serve_flags`) and the admission-time check
of requests to engines with hooks; and the log filter that drops vLLM's
warnings that are not true for the hook scheduler
(:mod:`vllm_seqhooks.engine.quiet_logs`). Without hook flags nothing changes.
"""

from __future__ import annotations


def register() -> None:
    """Entry point (``vllm.general_plugins``). Safe to call many times."""
    from vllm_seqhooks.engine import patches, quiet_logs

    patches.install_plugin_patches()
    quiet_logs.install()
