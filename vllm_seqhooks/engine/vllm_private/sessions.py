"""Parking borrows vLLM's streaming-input sessions: every use of that path.

A request that waits for its children (at ``<sync>``, a fork tag, or its
end) is kept the way vLLM keeps a streaming-input session between two
inputs: status ``WAITING_FOR_STREAMING_REQ``, its KV blocks and computed
tokens held; its join is the session's next input
(``_update_request_as_session``: only the new tokens are prefilled). The
engine's parts call the functions here (through ``SchedulerPort``), never
vLLM's methods.

What this relies on in vLLM's ``Scheduler`` (each checked at start-up by
:func:`session_problems`, for the installed release):

1. ``_handle_stopped_request(request)`` keeps a stopped request whose
   ``resumable`` is set (returns False: not finished), sets it to
   ``WAITING_FOR_STREAMING_REQ`` and counts it in
   ``num_waiting_for_streaming_input``. 0.32 queues it itself, through
   ``_enqueue_waiting_request``, and :func:`park_stopped` takes it out at
   once; 0.33 (``Release.kept_requests_queued_after_loop``) queues the kept
   requests after ``update_from_output``'s loop, and :func:`unqueue_parked`
   takes them out after that call.
2. ``_enqueue_waiting_request`` puts a request holding KV blocks
   (``_holds_kv_blocks``) in ``kv_holding_waiting``, any other in
   ``waiting``, and a request of a blocked status in ``deferred_waiting``
   too.
3. ``_update_request_as_session(session, update)`` drops the session's
   tokens after a point, appends the update's prompt tokens, takes its
   ``max_tokens`` and sampling parameters, and sets the status back to
   ``WAITING`` (uncounting a session that waited for input). 0.32 keeps the
   tokens up to ``num_computed_tokens``; 0.33
   (``Release.session_keeps_up_to_last_token``) up to its last token, so
   :func:`resume_session` first cuts the session to its computed tokens and
   one more.
4. ``schedule`` counts ``num_waiting_for_streaming_input`` as holding
   model-runner slots, and ``get_num_unfinished_requests`` subtracts it.
   Parked requests hold no slot (the worker dropped their state) and are
   unfinished: :func:`parked_not_waiting` uncounts them around those calls.

It can go when vLLM gives a scheduler a way to hold a stopped request with
its blocks that is not a streaming session.
"""

from __future__ import annotations

import inspect
from collections import deque
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator

from vllm_seqhooks.engine.vllm_private.releases import Release, installed


def park_stopped(sched: Any, handle_stopped: Callable[[Any], bool], request: Any) -> None:
    """Keep the stopped ``request`` as vLLM keeps a waiting session (its
    blocks held, counted as waiting for input), through vLLM's own
    ``handle_stopped`` (``_handle_stopped_request`` bound to ``sched``); it
    then waits outside vLLM's queues, where vLLM would look at it and skip it
    at every step, until :func:`requeue`. (A release that queues kept
    requests after its output loop: :func:`unqueue_parked`.)"""
    was_resumable, request.resumable = request.resumable, True
    try:
        finished = handle_stopped(request)
    finally:
        request.resumable = was_resumable
    assert not finished, "vLLM finished a request kept as a session"
    if not installed().kept_requests_queued_after_loop:
        _unqueue(sched, request)


def unqueue_parked(sched: Any, requests: Iterable[Any]) -> None:
    """After ``update_from_output``: take the requests kept as sessions in
    it out of the queues a release that queues them after its output loop
    put them in (none on a release that queues them in
    ``_handle_stopped_request``: :func:`park_stopped` did)."""
    if installed().kept_requests_queued_after_loop:
        for request in reversed(list(requests)):  # (queued in this order, at the end)
            _unqueue(sched, request)


def _unqueue(sched: Any, request: Any) -> None:
    """Take ``request`` out of the queue ``_enqueue_waiting_request`` chose
    for it (at the end, in FCFS order, where it was just queued)."""
    queue = sched.kv_holding_waiting if sched._holds_kv_blocks(request) else sched.waiting
    if isinstance(queue, deque) and queue and queue[-1] is request:
        queue.pop()
    else:
        queue.remove_request(request)
    sched.deferred_waiting.discard(request)


def drop_worker_state(sched: Any, request_id: str) -> None:
    """The workers drop the state they keep for a parked request (its
    model-runner slot), as for a finished one: its id goes out with the next
    step's ``finished_req_ids`` (a set vLLM makes anew each step, so it is
    looked up here, not held); the request is sent whole again when it
    resumes."""
    sched.finished_req_ids.add(request_id)


def resume_session(sched: Any, request: Any, update: Any) -> None:
    """The parked ``request``'s next input (a ``StreamingUpdate``): vLLM
    keeps its tokens up to ``num_computed_tokens`` and appends the update's
    (status ``WAITING``; not queued: :func:`requeue`). On a release whose
    session update keeps the tokens up to the last one, the request is cut
    to its computed tokens and one more first (the one the update drops)."""
    if installed().session_keeps_up_to_last_token:
        _cut_to_computed_and_one(request)
    sched._update_request_as_session(request, update)


def _cut_to_computed_and_one(request: Any) -> None:
    """Leave ``request`` its first ``num_computed_tokens`` tokens and one
    more: its next one when it has it, else a stand-in (its last token
    again), which the session update drops. (Its output tokens are read
    from these and cleared by the session update.)"""
    keep = request.num_computed_tokens
    tokens = request._all_token_ids
    if len(tokens) > keep + 1:
        del tokens[keep + 1:]
    elif len(tokens) == keep:
        tokens.append(tokens[-1])


def requeue(sched: Any, request: Any) -> None:
    """Queue a resumed ``request`` as vLLM queues a waiting request: among
    those holding KV blocks if it holds some, else among the others."""
    sched._enqueue_waiting_request(request)


@contextmanager
def parked_not_waiting(sched: Any, parked: int) -> Iterator[None]:
    """For the vLLM call inside, ``parked`` requests are not sessions
    waiting for input (assumption 4 of the module doc)."""
    sched.num_waiting_for_streaming_input -= parked
    try:
        yield
    finally:
        sched.num_waiting_for_streaming_input += parked


def session_problems(release: Release) -> list[str]:
    """The module doc's assumptions that the installed vLLM (``release``)
    breaks."""
    from vllm.v1.core.sched.scheduler import Scheduler

    found = []

    def source(name: str) -> str:
        return inspect.getsource(getattr(Scheduler, name))

    stopped = source("_handle_stopped_request")
    for needed, what in (
            ("request.resumable", "checks request.resumable"),
            ("WAITING_FOR_STREAMING_REQ", "keeps the request as a waiting session"),
            ("self.num_waiting_for_streaming_input += 1", "counts the waiting session")):
        if needed not in stopped:
            found.append(f"Scheduler._handle_stopped_request no longer {what}")
    queues_itself = "self._enqueue_waiting_request(request)" in stopped
    if release.kept_requests_queued_after_loop:
        after_loop = source("update_from_output")
        if queues_itself or "continuing_reqs.append(request)" not in after_loop or (
                "self._enqueue_waiting_request(request)" not in after_loop):
            found.append("Scheduler.update_from_output no longer queues the requests "
                         "_handle_stopped_request kept, after its loop")
    elif not queues_itself:
        found.append("Scheduler._handle_stopped_request no longer queues the kept request itself")
    enqueue = source("_enqueue_waiting_request")
    for needed in ("self._holds_kv_blocks(request)", "self.kv_holding_waiting.add_request",
                   "self.waiting.add_request", "self.deferred_waiting.add"):
        if needed not in enqueue:
            found.append(f"Scheduler._enqueue_waiting_request no longer calls {needed}")
    session = source("_update_request_as_session")
    cut = ("keep_end = session.num_tokens - 1" if release.session_keeps_up_to_last_token
           else "del session._all_token_ids[num_computed_tokens:]")
    for needed, what in (
            (cut, "cuts the session's tokens where this release is expected to"),
            ("session.max_tokens = update.max_tokens", "takes the update's max_tokens"),
            ("session.status = RequestStatus.WAITING", "sets the session back to WAITING")):
        if needed not in session:
            found.append(f"Scheduler._update_request_as_session no longer {what}")
    for name in ("schedule", "get_num_unfinished_requests"):
        if "num_waiting_for_streaming_input" not in source(name):
            found.append(f"Scheduler.{name} no longer reads num_waiting_for_streaming_input")
    return found
