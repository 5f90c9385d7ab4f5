"""The private methods of vLLM's ``Scheduler`` that the hook scheduler
(:mod:`vllm_seqhooks.engine.scheduler`) overrides: the other half of the
patch table (:mod:`vllm_seqhooks.engine.patches` lists the functions wrapped
in place). Each override calls vLLM's own method (``super()``) and no other
private one; its signature is checked at start-up (``SCHEDULER_METHODS`` in
:mod:`.scheduler`), and ``tests/test_vllm_private.py`` fails when the hook
scheduler overrides a private method not listed here, or lists one it does
not override.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Override:
    name: str
    why: str
    relies_on: str
    can_go: str


OVERRIDES: tuple[Override, ...] = (
    Override(
        "_update_request_with_output",
        why="every token a request with hooks samples is scanned here: promises, <sync>, "
            "fork tags, child budgets, stops cut inside accepted drafts (speculative "
            "decoding); a step in which no request has hook work binds vLLM's own method "
            "for the step (scheduler_calls.bind_stock_request_updates)",
        relies_on="update_from_output calls it once per request and step with the new "
                  "token ids, and keeps what it returns (kept tokens, stopped); on 0.32 "
                  "AsyncScheduler overrides it for output placeholders and the hook "
                  "scheduler sits above both; 0.33 folds that into Scheduler's and takes "
                  "back the computed tokens it cuts at a stop "
                  "(scheduler_calls.request_update_for_hooks makes both releases alike)",
        can_go="when vLLM gives a scheduler a per-request hook on sampled tokens that may "
               "stop the request and add requests (logits processors cannot)"),
    Override(
        "_handle_stopped_request",
        why="a request stopped at <sync> (or at its end) with open children is parked "
            "instead of finished: kept as a waiting session (sessions.park_stopped)",
        relies_on="the assumptions listed and checked in .sessions (0.32 queues the kept "
                  "request inside this method, 0.33 after update_from_output's loop: "
                  "sessions.unqueue_parked)",
        can_go="when vLLM lets a scheduler keep a stopped request with its blocks without "
               "posing as a streaming session"),
    Override(
        "_get_local_prefix_cache_hit",
        why="a splice join's child gets its parked parent's whole computed context as its "
            "hit, spliced paths included, so that it computes only its own tokens (the last "
            "partly filled block copied on write; without the prefix cache, slot by slot): "
            "splicing.child_context_hit",
        relies_on="admission asks it for every waiting request's local hit, and the hit it "
                  "returns is what gets allocated (0.33 adds max_cache_hit_length, passed "
                  "through; the child's hit stops at it)",
        can_go="when vLLM lets a scheduler give a new request another request's computed "
               "KV as its context"),
    Override(
        "_free_request",
        why="a child's hook state lives until its parent took its output; a spliced child's "
            "blocks are held for its parent (delay_free_blocks=True, freed later with "
            "scheduler_calls.free_held_blocks)",
        relies_on="every finished request passes here once, and delay_free_blocks keeps the "
                  "blocks allocated until _free_blocks",
        can_go="when vLLM tells a scheduler a request is freed (a callback) and lets it "
               "hand a request's blocks to another"),
    Override(
        "_preempt_request",
        why="counts preemptions (spliced requests apart) and puts a preempted child back "
            "among the children the waiting queue serves first",
        relies_on="every preemption, vLLM's and fair share's, passes here",
        can_go="when vLLM reports preemptions to the scheduler's subclass (a callback)"),
    Override(
        "_handle_blocked_waiting_request",
        why="fair share holds a waiting child of an over-share family back for a step, "
            "keeping its place in the queue",
        relies_on="schedule() asks it for each waiting request it considers and skips the "
                  "request for this step when it returns False",
        can_go="when vLLM's scheduler takes an admission policy"),
)

OVERRIDDEN = frozenset(o.name for o in OVERRIDES)
