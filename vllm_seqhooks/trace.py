"""Reading the hook trace of a finished request.

The scheduler puts each root request's fork/join tree in the final output's
``kv_transfer_params["seqhooks"]`` (the one free-form field vLLM carries from
EngineCore to ``RequestOutput`` and to OpenAI responses). This module turns it
into ``output.hook_trace``, adding decoded text for payloads and outputs.
No vLLM import.
"""

from __future__ import annotations

from typing import Any, Iterable

TRACE_KEY = "seqhooks"


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
    """The hook tree of a finished ``RequestOutput`` (None if no hook fired)."""
    existing = getattr(output, "hook_trace", None)
    if existing is not None:
        return existing
    trace = raw_trace(output)
    if trace is not None and tokenizer is not None:
        decorate(trace, lambda ids: tokenizer.decode(ids, skip_special_tokens=False))
    return trace


def attach_traces(outputs: Iterable[Any], tokenizer: Any) -> None:
    for out in outputs:
        try:
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
