"""A finished root request's output carries its family's trace
(:func:`vllm_seqhooks.core.trace.build_trace`), and its family's state goes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_seqhooks.core.trace import TRACE_KEY, build_trace
from vllm_seqhooks.engine.state import ForkJoinState

if TYPE_CHECKING:
    from vllm.v1.engine import EngineCoreOutput


def attach_trace(fork_join: ForkJoinState, out: EngineCoreOutput, engine: str) -> None:
    """Attach the trace of ``out``'s family when ``out`` is a root request's
    (under ``kv_transfer_params[TRACE_KEY]``) and forget the family; any
    other output is left as it is. ``engine``: the engine's name in traces."""
    fj = fork_join
    rid = out.request_id
    node = fj.tree.get(rid)
    if node is None or node.parent_id is not None:
        return
    nodes = fj.tree.pop_tree(rid)
    family = fj.drop_family(rid)
    trace = build_trace(nodes, limits=family.summary() if family is not None else None,
                        engine=engine)
    params = dict(out.kv_transfer_params or {})
    params[TRACE_KEY] = trace
    out.kv_transfer_params = params
    fj.drop_state(rid)
    for n in nodes[1:]:
        fj.children.pop(n.request_id, None)
        fj.drop_state(n.request_id)
