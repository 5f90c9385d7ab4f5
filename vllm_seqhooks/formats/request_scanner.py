"""Which scanner reads a request's sampled tokens (pure, no vLLM import):
the tag format's or the promise protocol's, or none when nothing the request
samples can matter."""

from __future__ import annotations

from typing import Any, Callable

from vllm_seqhooks.core.admission import RequestHooks
from vllm_seqhooks.formats.events import HookScanner
from vllm_seqhooks.formats.promise import PromiseScanner
from vllm_seqhooks.formats.tag_format_scanner import TagFormatScanner
from vllm_seqhooks.formats.text_codec import TextCodec


def request_scanner(hooks: Any, rh: RequestHooks, codec: Callable[[], TextCodec]
                    ) -> HookScanner | None:
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
    return PromiseScanner(hooks.sync_token_id, hooks.promise_token_id,
                          hooks.promise_end_token_id, max_promises=rh.max_children)
