"""Families picked by their prompts: how a load generator that sends plain
prompts (``vllm bench serve``) drives ThreadWeaver-format families on a
GPU-timed engine.

A request that carries no script gets the one its prompt picks: the first
``prompt_tokens`` token ids seed a :class:`random.Random`, which draws a
trace (:func:`.traces.draw_trace` at ``scale``) and writes its text
(:func:`.traces.trace_text`). ``mode="native"``: the request samples the
trace's parent text and each child the engine spawns (its prompt starts
with the same tokens) its thread, by its ``seqhooks_child_key``;
``mode="sequential"``: the request writes the whole trace itself, every
thread in turn. The benchmark computes the same traces from the same
prompts (:meth:`TraceBook.family`) for what it reports (critical paths).

Pure (no vLLM): :meth:`TraceBook.extra_args` gives the scripted-token keys
(:mod:`vllm_seqhooks.scripted.protocol`) for a prompt, merged under the
request's own keys (a child's key, a rejoined parent's tokens sampled
before), with ``encode`` turning text into token ids. A request marked
:data:`PLAIN_KEY` gets none.
"""

from __future__ import annotations

import random
import zlib
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks.gpu_timed.traces import Trace, TraceText, draw_trace, trace_text

MODES = ("native", "sequential")
#: A request whose own ``extra_args`` (``vllm_xargs``) set this key gets no
#: family: it samples the worker's filler token until ``max_tokens``, never a
#: hook tag (the grid's plain traffic: hooks on, nothing forking).
PLAIN_KEY = "gpu_timed_plain"


@dataclass
class TraceBook:
    mode: str
    scale: float
    prompt_tokens: int
    eos_token_id: int
    encode: Callable[[str], list[int]]
    _cache: dict[int, dict[str, Any]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"trace book mode {self.mode!r}: one of {MODES}")

    def seed(self, prompt_ids: Sequence[int]) -> int:
        head = list(prompt_ids[: self.prompt_tokens])
        if len(head) < self.prompt_tokens:
            raise ValueError(f"a prompt of {len(head)} tokens: the trace book reads the "
                             f"first {self.prompt_tokens}")
        return zlib.crc32(array("q", head).tobytes())

    def family(self, prompt_ids: Sequence[int]) -> tuple[Trace, TraceText]:
        rng = random.Random(self.seed(prompt_ids))
        trace = draw_trace(rng, scale=self.scale)
        return trace, trace_text(trace, rng)

    def extra_args(self, prompt_ids: Sequence[int],
                   own: Mapping[str, Any] | None) -> dict[str, Any]:
        """The request's ``extra_args`` with its family's script keys under
        its own (``own`` wins); a plain request's (:data:`PLAIN_KEY`) as they
        are."""
        if own and own.get(PLAIN_KEY):
            return dict(own)
        seed = self.seed(prompt_ids)
        scripted = self._cache.get(seed)
        if scripted is None:
            _, text = self.family(prompt_ids)
            scripted = {"seqhooks_script_end": "eos", "seqhooks_eos_token_id": self.eos_token_id}
            if self.mode == "sequential":
                scripted["seqhooks_script"] = self.encode(text.sequential)
            else:
                scripted["seqhooks_script"] = self.encode(text.parent)
                scripted["seqhooks_child_scripts"] = {k: self.encode(v)
                                                      for k, v in text.children.items()}
                scripted["seqhooks_child_script_end"] = "eos"
            self._cache[seed] = scripted
        return {**scripted, **(own or {})}


def prompt_text(index: int, tokens: int) -> str:
    """The ``index``-th family's prompt: ``tokens`` one-character tokens of
    the tiny model, different for every index."""
    rng = random.Random(f"prompt-{index}")
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(tokens))
