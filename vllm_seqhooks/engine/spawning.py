"""Spawning: a closed payload (or a tag format's fork, one child per label)
becomes a child ``Request`` with its prompt, budget and sampling parameters
(:mod:`vllm_seqhooks.core.join_plan` decides), queued family by family ahead
of requests that have not started (:mod:`vllm_seqhooks.core.child_queue`).

A promise the limits refuse is plain text. A fork's children are deferred
past the live-children limits instead (a fork that spawns part of its
children, or none, leaves a parent trained on forks that ran with a merge
it never saw): they wait in the tree, the parent parked on them, and start
as children end."""

from __future__ import annotations

import copy
import logging
from collections import deque
from typing import Callable

from vllm import SamplingParams
from vllm.v1.request import Request

from vllm_seqhooks.config.request_keys import CHILD_KEY_ARG, SAMPLED_BEFORE_ARG
from vllm_seqhooks.config.special_kwargs import SpecialKwargs
from vllm_seqhooks.core.child_params import cleared_in
from vllm_seqhooks.core.child_queue import ChildrenFirst
from vllm_seqhooks.core.family_limits import ENGINE_LIVE, TRANSIENT_REFUSALS
from vllm_seqhooks.core.join_plan import (
    child_budget, common_prefix, promise_prompt, promise_prompt_len)
from vllm_seqhooks.core.request_tree import FAILED, RUNNING, HookNode, derive_seed
from vllm_seqhooks.engine import vllm_private
from vllm_seqhooks.engine.family_limits import FamilyLimits
from vllm_seqhooks.engine.metrics import HookMetrics
from vllm_seqhooks.engine.splicing import Splicing
from vllm_seqhooks.engine.state import DeferredChild, ForkJoinState, HookState
from vllm_seqhooks.engine.vllm_private import SchedulerPort
from vllm_seqhooks.formats.events import ForkReached, PayloadClosed
from vllm_seqhooks.formats.boundaries import child_prompt

# Under vLLM's "vllm" logger: same handlers, format and VLLM_LOGGING_LEVEL.
logger = logging.getLogger("vllm.seqhooks.scheduler")


class Spawning:
    """Spawns child requests from closed payloads and forks.
    ``add_request``: the hook scheduler's own (a child is admitted like
    any request); ``text_codec()``: the engine's text codec."""

    def __init__(self, fork_join: ForkJoinState, hooks: SpecialKwargs, metrics: HookMetrics,
                 vllm: SchedulerPort, family_limits: FamilyLimits, splicing: Splicing,
                 text_codec: Callable, add_request: Callable[[Request], None]) -> None:
        self.fork_join = fork_join
        self.hooks = hooks
        self.metrics = metrics
        self.vllm = vllm
        self.family_limits = family_limits
        self.splicing = splicing
        self.text_codec = text_codec
        self.add_request = add_request

    # ------------------------------------------------------------ refusals
    def spawn_refusal(self, st: HookState, ev: PayloadClosed) -> str | None:
        """Why a closed payload spawns no child (None: it spawns one).
        Changes nothing (the speculative look-ahead asks too)."""
        refusal = self.family_limits.refusal(st)
        if refusal is not None:
            return refusal
        prompt_len = promise_prompt_len(self.hooks, ev.start, ev.end, ev.context_end)
        if prompt_len == 0:
            return "empty_payload"
        return "max_model_len" if prompt_len >= self.vllm.max_model_len else None

    def fork_refusal(self, st: HookState, ev: ForkReached) -> str | None:
        """Why a fork tag spawns no (more) children (None: it does, now or,
        past the live-children limits, once children end)."""
        min_tokens = self.hooks.fork_min_tokens
        if min_tokens is not None and st.orig_max_tokens - st.sampled < min_tokens:
            return "fork_min_tokens"
        refusal = self.family_limits.refusal(st)
        return None if refusal in TRANSIENT_REFUSALS else refusal

    def ignore_promise(self, st: HookState, pos: int, reason: str) -> None:
        node = self.fork_join.tree.ensure_root(st.request.request_id)
        node.ignored_promises.append({"position": pos, "reason": reason})
        if st.family is not None:
            st.family.promise_ignored(reason)
        self.metrics.inc("promises_ignored", 1)
        logger.debug("%s: promise at %d ignored (%s)", st.request.request_id, pos, reason)

    # ------------------------------------------------------------- spawning
    def spawn(self, st: HookState, ev: PayloadClosed) -> None:
        """A promise's child: its prompt is the parent's context or the payload."""
        refusal = self.spawn_refusal(st, ev)
        if refusal is not None:
            self.ignore_promise(st, ev.start - 1, refusal)
            return
        hooks = self.hooks
        tokens = st.request.all_token_ids
        prompt = promise_prompt(hooks, tokens, ev.start, ev.end, ev.context_end)
        # (A fork context is the parent's tokens: all of it is shared.)
        shared = len(prompt) if hooks.child_context == "fork" else None
        child_id, node = self._new_node(st, prompt, list(tokens[ev.start:ev.end]),
                                        shared=shared)
        self._start_child(st, child_id, node, prompt, ev.end)

    def fork(self, st: HookState, ev: ForkReached) -> None:
        """A tag format's fork: one child per label, each starting from the
        parent's context through the fork tag, then its lead and header
        (formats.boundaries.child_prompt)."""
        fmt = self.hooks.tag_format
        codec = self.text_codec()
        context = list(st.request.all_token_ids[: ev.pos + 1])
        deferring = False
        for label in ev.labels:
            prompt, kept = child_prompt(codec, fmt, context, ev.tag_start, label)
            start = prompt[kept:]
            refusal = self.fork_refusal(st, ev)
            if refusal is None and len(prompt) >= self.vllm.max_model_len:
                refusal = "max_model_len"
            if refusal is not None:
                self.ignore_promise(st, ev.pos, refusal)
                continue
            child_id, node = self._new_node(st, prompt, list(start), start, label)
            # Once one waits, the fork's later children wait behind it.
            deferring = deferring or self.family_limits.refusal(st) is not None
            if deferring:
                self.fork_join.deferred_children.append(
                    DeferredChild(st.request.request_id, child_id, prompt, ev.pos))
                self.metrics.inc("children_deferred", 1)
                logger.debug("%s deferred %s (live-children limits)",
                             st.request.request_id, child_id)
            else:
                self._start_child(st, child_id, node, prompt, ev.pos)

    def spawn_deferred(self) -> None:
        """Start deferred children, oldest first, while the live-children
        limits leave room; one whose family may not spawn any more (budget,
        deadline, descendants) fails, and its parent joins without it."""
        fj = self.fork_join
        waiting, fj.deferred_children = fj.deferred_children, deque()
        while waiting:
            entry = waiting.popleft()
            st = fj.states.get(entry.parent_id)
            node = fj.tree.get(entry.child_id)
            if st is None or node is None or node.state != RUNNING:
                continue  # its parent or itself is gone
            refusal = self.family_limits.refusal(st)
            if refusal in TRANSIENT_REFUSALS:
                fj.deferred_children.append(entry)
                if refusal == ENGINE_LIVE:
                    fj.deferred_children.extend(waiting)
                    return
            elif refusal is not None:
                self.ignore_promise(st, entry.closed_at, refusal)
                self.metrics.child_ended(FAILED)
                parent_id = fj.tree.child_ended(entry.child_id, FAILED, [], refusal)
                if parent_id is not None and fj.waits_for_children(parent_id):
                    fj.ready_joins.append(parent_id)
            else:
                self._start_child(st, entry.child_id, node, entry.prompt, entry.closed_at)

    def _new_node(self, st: HookState, prompt: list[int], payload: list[int],
                  start_tokens=(), label: str | None = None, shared: int | None = None
                  ) -> tuple[str, HookNode]:
        """A new child's id and its node in the request tree (``shared``:
        how many of its prompt's first tokens are its parent's, when known)."""
        fj = self.fork_join
        parent_id = st.request.request_id
        fj.tree.ensure_root(parent_id)
        child_id = fj.tree.new_child_id(parent_id)
        while child_id in self.vllm.requests:  # a client request already has that id
            child_id += "~"
        node = fj.tree.add_child(parent_id, child_id, payload, len(prompt),
                                 start_tokens, label)
        # What of its parent's tokens its prompt starts with, and the rest
        # (the trace's per-call rows rebuild its prompt from them). A tag
        # format's join may give the fork tag's last token back re-tokenized:
        # counted in the rest, so that the shared part is the parent's for good.
        if shared is None:
            shared = common_prefix(prompt, st.request.all_token_ids)
        if self.hooks.tag_format is not None:
            shared = min(shared, len(prompt) - len(start_tokens) - 1)
        node.context_tokens = max(shared, 0)
        node.prompt_rest = tuple(prompt[node.context_tokens:])
        return child_id, node

    def _start_child(self, st: HookState, child_id: str, node: HookNode, prompt: list[int],
                     closed_at: int) -> None:
        """Queue child ``child_id`` with ``prompt``; its budget is what the
        parent had left when it sampled the token at ``closed_at``."""
        fj = self.fork_join
        parent = st.request
        # (With speculative decoding, tokens after it may be in this step.)
        sampled_after = max(0, parent.num_tokens - 1 - closed_at)
        budget = child_budget(st.child_max_tokens, st.orig_max_tokens, st.sampled - sampled_after,
                              self.vllm.max_model_len - len(prompt))
        if st.family is not None:
            budget = st.family.child_budget(budget)
        child = Request(
            request_id=child_id,
            prompt_token_ids=prompt,
            sampling_params=_child_params(parent, budget, node.key),
            pooling_params=None,
            client_index=parent.client_index,
            # A child queues at its parent's place (priority policy orders by
            # arrival time), ahead of requests that arrived after the parent.
            arrival_time=parent.arrival_time,
            lora_request=parent.lora_request,
            cache_salt=parent.cache_salt,
            priority=parent.priority,
            trace_headers=parent.trace_headers,
            block_hasher=None,  # the parent's, and its hashes (next line)
        )
        vllm_private.share_block_hashes(child, parent, self.vllm.hash_block_size,
                                        node.context_tokens, self.vllm.hash_lookahead)
        fj.children[child_id] = child
        self.splicing.inherit(parent.request_id, child_id)
        self.add_request(child)
        if st.family is not None and st.family.forked_after is None:
            st.family.forked_after = fj.arrivals
        self.family_limits.child_spawned(st.family, child_id)
        self._queue_first(child)
        self.metrics.inc("children_spawned", 1)
        self.metrics.inc("fork_prompt_tokens", len(prompt))
        logger.debug("%s spawned %s (key %s, %d prompt tokens, budget %d)",
                     parent.request_id, child_id, node.key, len(prompt), budget)

    # --------------------------------------------------------------- queue
    def _queue_first(self, child: Request) -> None:
        """Children wait ahead of requests that have not started, family by
        family. With the priority policy the parent's arrival time already
        orders the child so."""
        queue = self.vllm.waiting
        if isinstance(queue, ChildrenFirst) and queue and queue[-1] is child:
            queue.pop()
            queue.insert_child(child)

    def requeue_child(self, child: Request) -> None:
        """A preempted child (vLLM put it at the front of the queue) waits
        at its family's place too."""
        queue = self.vllm.waiting
        if isinstance(queue, ChildrenFirst) and queue and queue[0] is child:
            queue.popleft()
            queue.insert_child(child)


def _child_params(parent: Request, budget: int, key: str):
    """A child's sampling parameters, field by field as
    :data:`vllm_seqhooks.core.child_params.CHILD_PARAMS` decides: its
    parent's, with ``n=1``, its own budget and key, a seed derived from a
    seeded parent's, and the fields the parent's own sampling alone reads
    cleared (``min_tokens``, ``structured_outputs``, ...). A shallow copy:
    the child shares what it does not change (stop lists, logit bias:
    read-only in EngineCore), and its ``extra_args`` is a new dict."""
    sp = copy.copy(parent.sampling_params)
    sp.n = 1
    sp.max_tokens = budget
    for name, value in _CLEARED.items():
        setattr(sp, name, value)
    extra = dict(sp.extra_args or {})
    extra.pop(SAMPLED_BEFORE_ARG, None)
    extra[CHILD_KEY_ARG] = key
    sp.extra_args = extra
    if sp.seed is not None:
        sp.seed = derive_seed(sp.seed, key)
    return sp


#: What a child's parameters clear (those of the installed vLLM's fields).
_CLEARED = cleared_in(SamplingParams.__struct_fields__)
