"""The embedded trained models' tasks (digit sorting with fork/join, in the
promise protocol and in ThreadWeaver's format): problems, training and
evaluation texts, checkers. The models themselves are in ``../data/``."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/vllm-seqhooks/PARTS``: where the project's
    scripts and benchmarks write by default. The shipped files (the models in
    ``vllm_seqhooks/data/``, the pages in ``docs/``) change only when a
    script's ``--out`` names them."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base, "vllm-seqhooks", *parts)


def trained_model_dir(name: str) -> Path:
    """Where ``scripts/train_tiny_forkjoin.py`` writes the model ``name``
    (``forkjoin_model``, ``threadweaver_model``) without ``--out``."""
    return cache_dir("models", name)
