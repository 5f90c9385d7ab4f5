"""`RequestTree`: the fork/join request tree.

Pure Python, no vLLM import. It knows which request spawned which, in what
order, which children are still open (not yet merged into their parent),
whether a parent's open children have all ended, what to merge, and which requests an abort
must take down. Its nodes are what :func:`vllm_seqhooks.core.trace.build_trace`
turns into the trace callers read once a request finishes.

Node states: a child is ``running`` until it ends (``finished``, ``failed``
or ``aborted``), then ``merged`` once its parent joined it.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Sequence

from vllm_seqhooks.core.join_plan import merged_layout

RUNNING = "running"
FINISHED = "finished"
FAILED = "failed"
ABORTED = "aborted"
MERGED = "merged"
ENDED = (FINISHED, FAILED, ABORTED)
#: Child request ids are "<parent id>@seqhooks-child<index>".
CHILD_ID_MARKER = "@seqhooks-child"


def derive_seed(seed: int, key: str) -> int:
    """A child's seed from its seeded parent's seed and the child's key."""
    digest = hashlib.blake2b(f"{seed}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF_FFFF


@dataclass
class JoinRecord:
    time: float
    children: list[str]
    merged_tokens: int
    #: Set when the parent is scheduled again: tokens it prefilled at resume,
    #: and tokens whose KV it kept (computed before the join).
    prefilled_tokens: int | None = None
    reused_tokens: int | None = None
    truncated: bool = False
    #: "reprefill" or "splice"; why a splice join fell back to re-prefill.
    mode: str = "reprefill"
    fallback: str | None = None
    #: Where the merged tokens start in the parent's output, and who gave
    #: them: [child key or None (the engine inserted them), count] runs
    #: (None where a merge re-tokenized text).
    at: int | None = None
    pieces: list[list] | None = None
    #: A splice join: each path's tokens (its child's start and output);
    #: whether the parent's KV had been spilled, and its own tokens it then
    #: copied from its first child (those no block it took back held);
    #: tokens of the first path whose KV blocks the parent adopted from its
    #: child (not copied).
    splice_paths: list[int] | None = None
    splice_after_spill: bool = False
    splice_context_copied: int | None = None
    splice_adopted_tokens: int | None = None


@dataclass
class HookNode:
    request_id: str
    parent_id: str | None = None
    depth: int = 0
    #: "" for a root, "0", "1", ... for its children, "0.1" for a grandchild.
    key: str = ""
    payload: list[int] = field(default_factory=list)
    #: Tag formats: the tokens its prompt ends with after the parent's
    #: context (lead and header).
    start_tokens: tuple[int, ...] = ()
    #: Tag formats: its outline label, and what it gives a ``"text"`` merge.
    label: str | None = None
    output_text: bytes | None = None
    state: str = RUNNING
    spawn_time: float | None = None
    finish_time: float | None = None
    join_time: float | None = None
    prompt_tokens: int = 0
    #: Prompt tokens found in the prefix cache when the request was admitted.
    cached_prompt_tokens: int | None = None
    output_tokens: list[int] | None = None
    #: Tokens the request sampled itself (its output minus merged tokens).
    sampled_tokens: int | None = None
    #: Tokens of spliced paths it computed again with causal attention.
    splice_recomputed_tokens: int = 0
    #: Its prompt: its parent's first ``context_tokens`` tokens, then
    #: ``prompt_rest``.
    context_tokens: int = 0
    prompt_rest: tuple[int, ...] = ()
    #: A finished child: how many of its output's last tokens the engine
    #: added (a format's end text), and what it wrote that its output
    #: leaves out (its EOS, what followed its end tag).
    appended_tokens: int = 0
    dropped_token_ids: list[int] = field(default_factory=list)
    #: A joined child of a request that asked for logprobs: the logprob of
    #: each token its engine output held (what it sampled, then what it
    #: left out; a token its own joins inserted: 0.0).
    output_logprobs: list[float] | None = None
    finish_reason: str | None = None
    children: list[str] = field(default_factory=list)
    #: Children spawned since the last join (in promise order).
    open_children: list[str] = field(default_factory=list)
    ignored_promises: list[dict[str, Any]] = field(default_factory=list)
    joins: list[JoinRecord] = field(default_factory=list)


class RequestTree:
    """Request tree for fork/join. All methods are O(size of the family)."""

    def __init__(self, clock=time.time) -> None:
        self.nodes: dict[str, HookNode] = {}
        self._clock = clock
        self._child_seq = 0

    # ----------------------------------------------------------- structure
    def __contains__(self, request_id: str) -> bool:
        return request_id in self.nodes

    def get(self, request_id: str) -> HookNode | None:
        return self.nodes.get(request_id)

    def is_child(self, request_id: str) -> bool:
        node = self.nodes.get(request_id)
        return node is not None and node.parent_id is not None

    def ensure_root(self, request_id: str) -> HookNode:
        node = self.nodes.get(request_id)
        if node is None:
            node = HookNode(request_id=request_id)
            self.nodes[request_id] = node
        return node

    def new_child_id(self, parent_id: str) -> str:
        parent = self.nodes[parent_id]
        return f"{parent_id}{CHILD_ID_MARKER}{len(parent.children)}"

    def add_child(
        self,
        parent_id: str,
        child_id: str,
        payload: Sequence[int],
        prompt_tokens: int,
        start_tokens: Sequence[int] = (),
        label: str | None = None,
    ) -> HookNode:
        parent = self.ensure_root(parent_id)
        index = len(parent.children)
        key = str(index) if not parent.key else f"{parent.key}.{index}"
        child = HookNode(
            request_id=child_id,
            parent_id=parent_id,
            depth=parent.depth + 1,
            key=key,
            payload=list(payload),
            spawn_time=self._clock(),
            prompt_tokens=prompt_tokens,
            start_tokens=tuple(start_tokens),
            label=label,
        )
        self.nodes[child_id] = child
        parent.children.append(child_id)
        parent.open_children.append(child_id)
        return child

    def children_of(self, request_id: str) -> list[str]:
        node = self.nodes.get(request_id)
        return list(node.children) if node else []

    def subtree(self, request_id: str) -> list[str]:
        """Descendants of ``request_id`` (not itself), parents before children."""
        out: list[str] = []
        stack = list(reversed(self.children_of(request_id)))
        while stack:
            rid = stack.pop()
            out.append(rid)
            stack.extend(reversed(self.children_of(rid)))
        return out

    def with_subtrees(self, request_ids: Iterable[str]) -> list[str]:
        """``request_ids`` and all their descendants, each once, every
        request before its own descendants (what an abort takes down)."""
        out: list[str] = []
        seen: set[str] = set()
        for rid in request_ids:
            for r in (rid, *self.subtree(rid)):
                if r not in seen:
                    seen.add(r)
                    out.append(r)
        return out

    def live_descendants(self, request_id: str) -> list[str]:
        return [r for r in self.subtree(request_id) if self.nodes[r].state == RUNNING]

    # --------------------------------------------------------------- joins
    def has_open_children(self, request_id: str) -> bool:
        node = self.nodes.get(request_id)
        return bool(node and node.open_children)

    def ready_to_join(self, request_id: str) -> bool:
        node = self.nodes.get(request_id)
        if node is None or not node.open_children:
            return False
        return all(self.nodes[c].state in ENDED for c in node.open_children)

    def child_ended(
        self,
        child_id: str,
        state: str,
        output_tokens: Sequence[int] | None,
        finish_reason: str | None,
        output_text: bytes | None = None,
    ) -> str | None:
        """Record a child's end (what it gives its parent: ``output_tokens``,
        and ``output_text`` for a tag format's ``"text"`` merge). Returns its
        parent id when this was the parent's last open child (whether the
        parent waits for them, and so joins now, is the engine's to say)."""
        assert state in ENDED, state
        node = self.nodes.get(child_id)
        if node is None or node.state != RUNNING:
            return None
        node.state = state
        node.finish_time = self._clock()
        node.output_tokens = list(output_tokens or ())
        node.output_text = output_text
        node.finish_reason = finish_reason
        parent = self.nodes.get(node.parent_id) if node.parent_id else None
        if parent is not None and self.ready_to_join(parent.request_id):
            return parent.request_id
        return None

    def take_merge(
        self,
        request_id: str,
        separator: Sequence[int],
        failed_marker: Sequence[int] | None = None,
        suffix: Sequence[int] = (),
    ) -> tuple[list[int], list[str]]:
        """The promise protocol's merge of the open (all ended) children of
        ``request_id``, in spawn order (:func:`~vllm_seqhooks.core.join_plan.merged_layout`:
        outputs, ``separator``, ``suffix``; a failed or aborted child's output
        is ``failed_marker``, or nothing), and the join (:meth:`join_open_children`)."""
        nodes = [self.nodes[c] for c in self.nodes[request_id].open_children]
        outputs = [
            (c.output_tokens or []) if c.state == FINISHED else list(failed_marker or ())
            for c in nodes
        ]
        no_headers = [()] * len(nodes)
        merged = merged_layout(no_headers, no_headers, outputs, separator, suffix)
        return merged, self.join_open_children(request_id, len(merged))

    def join_open_children(self, request_id: str, merged_tokens: int = 0) -> list[str]:
        """Join the open (all ended) children of ``request_id``: a finished one
        becomes merged, and the join is recorded (with
        ``merged_tokens``). Returns the joined children, in spawn order."""
        node = self.nodes[request_id]
        children = list(node.open_children)
        now = self._clock()
        for cid in children:
            child = self.nodes[cid]
            if child.state == FINISHED:
                child.state = MERGED
            child.join_time = now
        node.open_children.clear()
        node.joins.append(JoinRecord(time=now, children=children, merged_tokens=merged_tokens))
        return children

    # ------------------------------------------------------------- removal
    def root_of(self, request_id: str) -> str:
        node = self.nodes[request_id]
        while node.parent_id is not None:
            node = self.nodes[node.parent_id]
        return node.request_id

    def pop_tree(self, request_id: str) -> list[HookNode]:
        """Forget ``request_id`` and its whole subtree; return the nodes."""
        if request_id not in self.nodes:
            return []
        ids = [request_id, *self.subtree(request_id)]
        nodes = [self.nodes.pop(r) for r in ids if r in self.nodes]
        root = nodes[0]
        if root.parent_id is not None and root.parent_id in self.nodes:
            parent = self.nodes[root.parent_id]
            if request_id in parent.open_children:
                parent.open_children.remove(request_id)
        return nodes

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[HookNode]:
        return iter(self.nodes.values())
