"""What hooks one request gets (pure, no vLLM import): the server's settings
narrowed by the request's own (``vllm_xargs``) and its depth in its family.
The scanner that reads its sampled tokens follows from it
(:func:`vllm_seqhooks.formats.request_scanner.request_scanner`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class RequestHooks:
    depth: int
    #: The request may spawn children (else its hooks are plain text).
    may_spawn: bool
    max_children: int
    child_max_tokens: int | None


def request_hooks(hooks: Any, per_request: Mapping[str, Any], depth: int) -> RequestHooks:
    """``hooks``: the server's SpecialKwargs; ``per_request``: the request's
    validated overrides (they can only lower the server's limits)."""
    max_depth = min(hooks.max_child_depth,
                    per_request.get("max_child_depth", hooks.max_child_depth))
    max_children = min(hooks.max_children_per_request,
                       per_request.get("max_children_per_request",
                                       hooks.max_children_per_request))
    return RequestHooks(
        depth=depth,
        may_spawn=depth < max_depth and max_children > 0,
        max_children=max_children,
        child_max_tokens=per_request.get("child_max_tokens", hooks.child_max_tokens),
    )
