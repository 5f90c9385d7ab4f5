"""Test-only: the process's torch on one thread for a while.

An in-process vLLM engine on CPU runs the tiny models with torch's default
of one OpenMP thread per core; on a machine busy with other processes those
threads spin waiting for each other (a 40-family step loop measured here
under a load average of 10-12: 27-49 s on two threads, 1.2 s on one). The
tiny models are as fast on one thread, and what the scheduler does does not
depend on it."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """torch on one thread inside, as before after (``torch._C``'s setter:
    an in-process vLLM engine on CPU replaces ``torch.set_num_threads`` by a
    warning)."""
    import torch

    before = torch.get_num_threads()
    torch._C.set_num_threads(1)
    try:
        yield
    finally:
        torch._C.set_num_threads(before)
