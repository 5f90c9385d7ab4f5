"""Start-up hook for processes that run vLLM's V2 model runner on CPU.

Python imports the first ``sitecustomize`` module on ``sys.path`` at start-up.
:func:`tests.support.v2_runner.v2_env` puts this file's directory
first on ``PYTHONPATH``, so every process started with that environment (the
test's subprocess and any engine-core process vLLM spawns from it) runs
:func:`register_cpu_backend_stub` before it can import vLLM.

Why: vLLM's CPU build enables Triton only when ``triton.backends.backends``
holds a ``"cpu"`` entry (Triton's CPU backend, not in the PyPI wheel), and
without Triton it falls back to the V1 model runner.  With
``TRITON_INTERPRET=1`` Triton interprets every kernel with NumPy/torch on the
host, so no real CPU backend is needed: a stub entry whose driver reports
itself active is enough.  The hook does nothing unless ``TRITON_INTERPRET=1``
and ``triton`` is importable.

This module imports nothing from ``vllm_seqhooks`` or vLLM (it runs before
either is importable for sure).  A ``sitecustomize`` later on ``sys.path``
(shadowed by this one) is still run.
"""

from __future__ import annotations

import os
import sys

#: The ``triton.backends.backends`` key vLLM's CPU build looks for.
BACKEND_NAME = "cpu"


def register_cpu_backend_stub() -> bool:
    """Register the stub ``"cpu"`` Triton backend; return whether it is there.

    Idempotent.  Returns False when ``triton`` is not importable.  An existing
    ``"cpu"`` entry (a real Triton CPU backend) is left alone.
    """
    try:
        from triton.backends import Backend, backends
        from triton.backends.compiler import BaseBackend
        from triton.backends.driver import DriverBase
    except ImportError:
        return False
    if BACKEND_NAME in backends:
        return True

    class InterpreterCPUDriver(DriverBase):
        """Reports itself active; kernels never reach it under the interpreter."""

        @classmethod
        def is_active(cls) -> bool:
            return True

    backends[BACKEND_NAME] = Backend(compiler=BaseBackend, driver=InterpreterCPUDriver)
    return True


def _run_shadowed_sitecustomize() -> None:
    """Run the next ``sitecustomize`` on ``sys.path`` after this directory."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


if __name__ == "sitecustomize":  # at start-up, not when imported as a library
    if os.environ.get("TRITON_INTERPRET") == "1":
        register_cpu_backend_stub()
    _run_shadowed_sitecustomize()
