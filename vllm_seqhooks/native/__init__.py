"""Compiled kernels (C) of the family batch order, optional.

The C extension ``_rows`` (``_rows.c``, ``grouping.c``, ``batch_rows.c``,
``moves.c``) holds the grouping decision of :mod:`vllm_seqhooks.core.batch_order`
and the row moves that apply it to the V1 model runner's persistent batch
(:mod:`vllm_seqhooks.engine.vllm_private.input_batch`): the same results as
their pure-Python implementations (``tests/test_native.py`` compares them),
with much less interpreter work per moved row. pip builds it when it installs
this package where a C compiler and Python's headers are present
(``setup.py``; the build is optional). Without it, or with
``SEQHOOKS_NATIVE=0`` in the environment, the Python implementations run.

:data:`rows` is the compiled module, or None; :data:`why_not` says why.
Nothing here imports vLLM or torch.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

#: The switch: ``SEQHOOKS_NATIVE=0`` runs the Python implementations.
ENV = "SEQHOOKS_NATIVE"

rows: ModuleType | None = None
why_not = ""
if os.environ.get(ENV, "1") == "0":
    why_not = f"{ENV}=0"
else:
    try:
        from vllm_seqhooks.native import _rows as rows
    except ImportError as exc:
        if not any(Path(__file__).parent.glob("_rows.*[!c]")):
            why_not = ("not built (pip builds it where a C compiler and Python's headers "
                       "are present when it installs this package)")
        else:  # built, but not for this interpreter, or broken
            why_not = f"not loaded ({exc})"
