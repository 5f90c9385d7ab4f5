"""The hook trace of a finished request: built, and read.

The scheduler puts each root request's fork/join tree (:func:`build_trace`,
from the request tree's nodes) in the final output's
``kv_transfer_params["seqhooks"]`` (the one free-form field vLLM carries from
EngineCore to ``RequestOutput`` and to OpenAI responses). The reading side
turns it into ``output.hook_trace``, adding decoded text for payloads and
outputs. No vLLM import.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from vllm_seqhooks.core.request_tree import HookNode

#: Key of the hook trace in a finished request's ``kv_transfer_params``.
TRACE_KEY = "seqhooks"
#: With ``n`` > 1: key of the list of traces, one per completion (in the
#: order of ``RequestOutput.outputs``; None where no hook fired). vLLM's
#: frontend keeps one ``kv_transfer_params`` for all ``n`` completions; the
#: frontend patch ``completion_traces`` collects each one's here, and
#: ``TRACE_KEY`` then holds the first completion's.
TRACES_KEY = "seqhooks_traces"


def with_completion_traces(params: dict[str, Any] | None,
                           traces: Sequence[dict[str, Any] | None]) -> dict[str, Any] | None:
    """A request's ``kv_transfer_params`` carrying one trace per completion
    (``traces``, in output order); ``params`` unchanged when none fired."""
    if not any(t is not None for t in traces):
        return params
    merged = {k: v for k, v in (params or {}).items() if k != TRACE_KEY}
    merged[TRACES_KEY] = list(traces)
    if traces[0] is not None:
        merged[TRACE_KEY] = traces[0]
    return merged


def completion_traces(output: Any) -> list[dict[str, Any] | None]:
    """One trace per completion of a finished output (``RequestOutput`` or
    an OpenAI response as a dict/object), in the order of its completions."""
    params = field_of(output, "kv_transfer_params") or {}
    listed = params.get(TRACES_KEY) if isinstance(params, dict) else None
    if isinstance(listed, list):
        return listed
    trace = params.get(TRACE_KEY) if isinstance(params, dict) else None
    return [trace if isinstance(trace, dict) else None]


def field_of(obj: Any, name: str) -> Any:
    """``obj``'s field ``name``: a dict's key, an attribute, or a pydantic
    model's extra field (an OpenAI response's ``kv_transfer_params``)."""
    if isinstance(obj, dict):
        return obj.get(name)
    found = getattr(obj, name, None)
    if found is None:  # a pydantic model's extra fields
        found = (getattr(obj, "model_extra", None) or {}).get(name)
    return found


def build_trace(
    nodes: Sequence[HookNode], decode=None, limits: dict[str, Any] | None = None,
    engine: str | None = None,
) -> dict[str, Any]:
    """A JSON-able tree for the root ``nodes[0]`` (as returned by pop_tree).

    ``decode`` (token ids -> str), when given, adds text fields; ``limits``
    (the family ledger's summary) is added as the root's ``limits``;
    ``engine`` (the data-parallel rank that ran the family, as in the
    metrics' ``engine`` label) as the root's ``engine``."""
    by_id = {n.request_id: n for n in nodes}

    def one(node: HookNode) -> dict[str, Any]:
        out: dict[str, Any] = {
            "request_id": node.request_id,
            "key": node.key,
            "depth": node.depth,
        }
        if node.parent_id is not None:
            out.update(
                state=node.state,
                finish_reason=node.finish_reason,
                payload_token_ids=list(node.payload),
                output_token_ids=list(node.output_tokens or ()),
                num_output_tokens=len(node.output_tokens or ()),
                sampled_tokens=node.sampled_tokens,
                prompt_tokens=node.prompt_tokens,
                context_tokens=node.context_tokens,
                appended_tokens=node.appended_tokens,
                dropped_token_ids=list(node.dropped_token_ids),
                prompt_rest_token_ids=list(node.prompt_rest),
                cached_prompt_tokens=node.cached_prompt_tokens,
                spawn_time=node.spawn_time,
                finish_time=node.finish_time,
                join_time=node.join_time,
            )
            if decode is not None:
                out["payload"] = decode(node.payload)
                out["output"] = decode(node.output_tokens or [])
        out["joins"] = [
            {
                "time": j.time,
                "children": [by_id[c].key if c in by_id else c for c in j.children],
                "merged_tokens": j.merged_tokens,
                "prefilled_tokens": j.prefilled_tokens,
                "reused_tokens": j.reused_tokens,
                "truncated": j.truncated,
                "mode": j.mode,
                "at": j.at,
                "pieces": j.pieces,
                **({"splice_paths": j.splice_paths} if j.splice_paths else {}),
                **({"splice_after_spill": True} if j.splice_after_spill else {}),
                **({"splice_context_copied": j.splice_context_copied}
                   if j.splice_context_copied else {}),
                **({"splice_adopted_tokens": j.splice_adopted_tokens}
                   if j.splice_adopted_tokens else {}),
                **({"fallback": j.fallback} if j.fallback else {}),
            }
            for j in node.joins
        ]
        if node.splice_recomputed_tokens:
            out["splice_recomputed_tokens"] = node.splice_recomputed_tokens
        if node.output_logprobs is not None:
            out["output_logprobs"] = node.output_logprobs
        if node.ignored_promises:
            out["ignored_promises"] = list(node.ignored_promises)
        out["children"] = [one(by_id[c]) for c in node.children if c in by_id]
        return out

    root = one(nodes[0])
    if engine is not None:
        root["engine"] = engine
    root["usage"] = family_usage(nodes)
    if limits is not None:
        root["limits"] = limits
    return root


def family_usage(nodes: Sequence[HookNode]) -> dict[str, int]:
    """What a request cost, its descendants included (``nodes[0]``: the
    request). Prefilled tokens are those the engine computed: children's
    prompt tokens not found in the prefix cache, and tokens prefilled at
    joins (``<sync>`` and the merged tokens, or more after a spill)."""
    root, descendants = nodes[0], nodes[1:]

    def join_prefill(node: HookNode) -> int:
        return sum(j.prefilled_tokens or 0 for j in node.joins)

    children_sampled = sum(n.sampled_tokens or 0 for n in descendants)
    children_prefilled = sum(
        n.prompt_tokens - (n.cached_prompt_tokens or 0) + join_prefill(n)
        for n in descendants
    )
    return {
        "merged_tokens": sum(j.merged_tokens for j in root.joins),
        "num_children": len(descendants),
        "children_prompt_tokens": sum(n.prompt_tokens for n in descendants),
        "children_cached_prompt_tokens": sum(n.cached_prompt_tokens or 0 for n in descendants),
        "children_sampled_tokens": children_sampled,
        "children_prefilled_tokens": children_prefilled,
        "sampled_tokens": root.sampled_tokens or 0,
        "join_prefill_tokens": join_prefill(root),
        "family_sampled_tokens": (root.sampled_tokens or 0) + children_sampled,
        "family_prefilled_tokens": join_prefill(root) + children_prefilled,
    }




def raw_trace(output: Any) -> dict[str, Any] | None:
    params = getattr(output, "kv_transfer_params", None) or {}
    trace = params.get(TRACE_KEY) if isinstance(params, dict) else None
    return trace if isinstance(trace, dict) else None


def decorate(trace: dict[str, Any], decode) -> dict[str, Any]:
    """Add ``payload``/``output`` text to every child of ``trace`` (in place)."""
    stack = [trace]
    while stack:
        node = stack.pop()
        if "payload_token_ids" in node and "payload" not in node:
            node["payload"] = decode(node["payload_token_ids"])
            node["output"] = decode(node["output_token_ids"])
        stack.extend(node.get("children", ()))
    return trace


def get_hook_trace(output: Any, tokenizer: Any = None) -> dict[str, Any] | None:
    """The hook tree of a finished ``RequestOutput`` (None if no hook fired;
    with ``n`` > 1, of ``outputs[0]``: :func:`get_hook_traces` has all)."""
    existing = getattr(output, "hook_trace", None)
    if existing is not None:
        return existing
    trace = raw_trace(output)
    if trace is not None and tokenizer is not None:
        decorate(trace, lambda ids: tokenizer.decode(ids, skip_special_tokens=False))
    return trace


def get_hook_traces(output: Any, tokenizer: Any = None) -> list[dict[str, Any] | None]:
    """The hook tree of each completion of a finished ``RequestOutput``, in
    the order of ``output.outputs`` (None where no hook fired)."""
    existing = getattr(output, "hook_traces", None)
    if existing is not None:
        return existing
    traces = completion_traces(output)
    if tokenizer is not None:
        decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
        for trace in traces:
            if trace is not None:
                decorate(trace, decode)
    return traces


def attach_traces(outputs: Iterable[Any], tokenizer: Any) -> None:
    """``hook_trace`` (the first completion's) and ``hook_traces`` (one per
    completion) on each output."""
    for out in outputs:
        try:
            out.hook_traces = get_hook_traces(out, tokenizer)
            out.hook_trace = get_hook_trace(out, tokenizer)
        except AttributeError:  # pragma: no cover - slotted output classes
            pass


def iter_nodes(trace: dict[str, Any]):
    """Depth-first over a trace's nodes (root first)."""
    stack = [trace]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(node.get("children", ())))


def format_tree(trace: dict[str, Any] | None, max_text: int = 60) -> str:
    """A human-readable rendering of a hook tree."""
    if not trace:
        return "(no hooks fired)"
    lines: list[str] = []

    def clip(s: str) -> str:
        s = s.replace("\n", "\\n")
        return s if len(s) <= max_text else s[: max_text - 3] + "..."

    def walk(node: dict[str, Any], indent: str) -> None:
        if node.get("key"):
            lines.append(
                f"{indent}child {node['key']} [{node.get('state')}, "
                f"{node.get('num_output_tokens', 0)} tokens, prompt "
                f"{node.get('prompt_tokens')} / cached {node.get('cached_prompt_tokens')}]"
                f" payload={clip(node.get('payload', str(node.get('payload_token_ids'))))!r}"
                f" -> {clip(node.get('output', str(node.get('output_token_ids'))))!r}"
            )
        else:
            lines.append(f"{indent}request {node['request_id']}")
        for j in node.get("joins", ()):
            lines.append(
                f"{indent}  join of {j['children']}: {j['merged_tokens']} merged tokens, "
                f"prefilled {j['prefilled_tokens']}, reused {j['reused_tokens']}"
                + (" (truncated)" if j.get("truncated") else "")
            )
        for ig in node.get("ignored_promises", ()):
            lines.append(f"{indent}  promise at {ig['position']} ignored: {ig['reason']}")
        for child in node.get("children", ()):
            walk(child, indent + "  ")

    walk(trace, "")
    return "\n".join(lines)
