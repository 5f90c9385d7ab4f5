"""Engine defaults a model carries beside its hook settings (pure, no vLLM).

A model's ``seqhooks.json`` may hold an ``"engine"`` object: engine
arguments sized to the model, used when hooks are on and the user gave no
value of their own. Without it, vLLM's defaults apply, which are sized to
the machine: on CPU half the free memory as KV cache and 128-token blocks,
for a model of any size (7-11 GiB and up to a minute of start-up for the
2.4M-parameter embedded models, whose whole context is one block).

Only arguments that size the engine to the model are accepted:

* ``kv_cache_memory_bytes``: the KV cache (it also stands for
  ``gpu_memory_utilization`` and ``VLLM_CPU_KVCACHE_SPACE``: a user who set
  either chose the memory, and the model's value is not used);
* ``block_size``: tokens per KV block (prefix-cache sharing between a
  parent and its children comes in whole blocks);
* ``max_model_len``: the longest context the model was trained for.
"""

from __future__ import annotations

import difflib
from typing import Any, Callable, Mapping

from vllm_seqhooks.config.field_checks import SpecialKwargsError, integer

#: The key of ``seqhooks.json`` that holds the engine defaults.
ENGINE_KEY = "engine"

CHECKS = {
    "kv_cache_memory_bytes": integer(1 << 20),
    "block_size": integer(1),
    "max_model_len": integer(1),
}

#: The engine arguments (besides the one named) by which a user chooses the
#: memory that ``kv_cache_memory_bytes`` would set.
MEMORY_CHOICES = ("kv_cache_memory_bytes", "gpu_memory_utilization")


def checked_engine_defaults(value: Any, where: str) -> dict[str, Any]:
    """The ``"engine"`` object of a settings file, checked: a JSON object
    whose keys are in :data:`CHECKS`, with valid values. ``where`` names the
    file in errors."""
    if not isinstance(value, Mapping):
        raise SpecialKwargsError(
            f"{where}: {ENGINE_KEY!r} must be a JSON object of engine arguments, "
            f"got {type(value).__name__}")
    unknown = [name for name in value if name not in CHECKS]
    if unknown:
        hints = []
        for name in unknown:
            near = difflib.get_close_matches(name, CHECKS, n=1)
            hints.append(f"{name!r} (did you mean {near[0]!r}?)" if near else repr(name))
        raise SpecialKwargsError(
            f"{where}: unknown {ENGINE_KEY!r} argument {', '.join(hints)}; a model's engine "
            f"defaults may set {', '.join(CHECKS)}")
    return {name: CHECKS[name](f"{where}: {ENGINE_KEY}.{name}", v) for name, v in value.items()}


def defaults_to_apply(defaults: Mapping[str, Any], given: Callable[[str], bool]) -> dict[str, Any]:
    """The model's ``defaults`` the user left unset: ``given(name)`` says
    whether the user set engine argument ``name``; a memory choice of any
    kind (:data:`MEMORY_CHOICES`, or ``VLLM_CPU_KVCACHE_SPACE`` as
    ``given("VLLM_CPU_KVCACHE_SPACE")``) keeps the model's KV cache size out."""
    chosen_memory = any(given(name) for name in (*MEMORY_CHOICES, "VLLM_CPU_KVCACHE_SPACE"))
    return {name: value for name, value in defaults.items()
            if not given(name) and not (name == "kv_cache_memory_bytes" and chosen_memory)}
