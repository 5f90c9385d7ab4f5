"""What hooks one request gets (pure, no vLLM import): the server's settings
narrowed by the request's own (``vllm_xargs``) and its depth in its family,
and the scanner that reads its sampled tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from vllm_seqhooks.formats import TagFormatScanner, TextCodec
from vllm_seqhooks.tokens import SpecialTokenProcessor


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


def new_scanner(hooks: Any, rh: RequestHooks, codec: Callable[[], TextCodec]
                ) -> SpecialTokenProcessor | TagFormatScanner | None:
    """The scanner of a request's sampled tokens, or None when nothing in
    them can matter (it may not spawn, and is no tag format's child)."""
    fmt = hooks.tag_format
    if fmt is not None:
        ends_at_tag = rh.depth > 0 and fmt.child_end_tag is not None
        if not (rh.may_spawn or ends_at_tag):
            return None
        return TagFormatScanner(fmt, codec(), may_fork=rh.may_spawn, ends_at_tag=rh.depth > 0,
                                max_children=rh.max_children)
    if not rh.may_spawn:
        return None
    return SpecialTokenProcessor(hooks.sync_token_id, hooks.promise_token_id,
                                 hooks.promise_end_token_id, max_promises=rh.max_children)
