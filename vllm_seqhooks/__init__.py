"""vllm-seqhooks: fork/join sequence hooks for vLLM's V1 engine.

``from vllm_seqhooks import LLM, SpecialKwargs``. Importing the package does
not import vLLM; ``LLM`` is loaded on first use.
"""

from vllm_seqhooks.config.special_kwargs import SpecialKwargs, SpecialKwargsError
from vllm_seqhooks.core.trace import format_tree, get_hook_trace, get_hook_traces

__version__ = "0.1.0"

__all__ = [
    "LLM",
    "SpecialKwargs",
    "SpecialKwargsError",
    "get_hook_trace",
    "get_hook_traces",
    "format_tree",
    "__version__",
]


def __getattr__(name: str):
    if name == "LLM":
        from vllm_seqhooks.llm import LLM

        return LLM
    raise AttributeError(f"module 'vllm_seqhooks' has no attribute {name!r}")
