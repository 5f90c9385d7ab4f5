"""A real ``vllm serve`` of the tiny model on 127.0.0.1 for tests and
benchmarks: the flags; starting, stopping and scraping are the product's
(:mod:`vllm_seqhooks.local_server`), re-exported here."""

from __future__ import annotations

from vllm_seqhooks.local_server import (  # noqa: F401 (re-exported)
    Server,
    free_port,
    metric,
    scrape,
    start_server,
    vllm_command,
)
from vllm_seqhooks.scripted.protocol import SCRIPTED_LOGITS_PROCESSOR_FQCN as SCRIPTED
from vllm_seqhooks.scripted.tiny_model import TINY_HOOK_FLAGS  # noqa: F401 (re-exported)

#: Engine flags for the tiny model on CPU.
TINY_FLAGS = ["--enforce-eager", "--dtype", "float32", "--max-model-len", "1024",
              "--block-size", "32", "--kv-cache-memory-bytes", str(64 << 20)]
