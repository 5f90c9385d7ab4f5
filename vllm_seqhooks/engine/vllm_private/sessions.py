"""Parking borrows vLLM's streaming-input sessions: every use of that path.

A request that waits for its children (at ``<sync>``, a fork tag, or its
end) is kept the way vLLM keeps a streaming-input session between two
inputs: status ``WAITING_FOR_STREAMING_REQ``, its KV blocks and computed
tokens held; its join is the session's next input
(``_update_request_as_session``: only the new tokens are prefilled). The
engine's parts call the functions here, never vLLM's methods.

What this relies on in vLLM 0.32's ``Scheduler`` (each checked at start-up
by :func:`session_problems`):

1. ``_handle_stopped_request(request)`` keeps a stopped request whose
   ``resumable`` is set (returns False: not finished), sets it to
   ``WAITING_FOR_STREAMING_REQ``, counts it in
   ``num_waiting_for_streaming_input`` and queues it itself, through
   ``_enqueue_waiting_request``. (vLLM 0.33 queues it after
   ``update_from_output``'s loop instead: :func:`park_stopped` is where
   that difference lands.)
2. ``_enqueue_waiting_request`` puts a request holding KV blocks
   (``_holds_kv_blocks``) in ``kv_holding_waiting``, any other in
   ``waiting``, and a request of a blocked status in ``deferred_waiting``
   too.
3. ``_update_request_as_session(session, update)`` keeps the tokens up to
   ``num_computed_tokens`` (dropping the last sampled one), appends the
   update's prompt tokens, takes its ``max_tokens`` and sampling
   parameters, and sets the status back to ``WAITING`` (uncounting a
   session that waited for input).
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
from typing import Any, Callable, Iterator


def park_stopped(sched: Any, handle_stopped: Callable[[Any], bool], request: Any) -> None:
    """Keep the stopped ``request`` as vLLM keeps a waiting session (its
    blocks held, counted as waiting for input), through vLLM's own
    ``handle_stopped`` (``_handle_stopped_request`` bound to ``sched``); it
    then waits outside vLLM's queues, where vLLM would look at it and skip it
    at every step, until :func:`requeue`."""
    was_resumable, request.resumable = request.resumable, True
    try:
        finished = handle_stopped(request)
    finally:
        request.resumable = was_resumable
    assert not finished, "vLLM finished a request kept as a session"
    # (the queue _enqueue_waiting_request chose for it, at the end)
    queue = sched.kv_holding_waiting if sched._holds_kv_blocks(request) else sched.waiting
    if isinstance(queue, deque) and queue and queue[-1] is request:
        queue.pop()  # (FCFS: it was just appended)
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
    (status ``WAITING``; not queued: :func:`requeue`)."""
    sched._update_request_as_session(request, update)


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


def session_problems() -> list[str]:
    """The module doc's assumptions that the installed vLLM breaks."""
    from vllm.v1.core.sched.scheduler import Scheduler

    found = []

    def source(name: str) -> str:
        return inspect.getsource(getattr(Scheduler, name))

    stopped = source("_handle_stopped_request")
    for needed, what in (
            ("request.resumable", "checks request.resumable"),
            ("WAITING_FOR_STREAMING_REQ", "keeps the request as a waiting session"),
            ("self.num_waiting_for_streaming_input += 1", "counts the waiting session"),
            ("self._enqueue_waiting_request(request)", "queues the kept request itself")):
        if needed not in stopped:
            found.append(f"Scheduler._handle_stopped_request no longer {what}")
    enqueue = source("_enqueue_waiting_request")
    for needed in ("self._holds_kv_blocks(request)", "self.kv_holding_waiting.add_request",
                   "self.waiting.add_request", "self.deferred_waiting.add"):
        if needed not in enqueue:
            found.append(f"Scheduler._enqueue_waiting_request no longer calls {needed}")
    session = source("_update_request_as_session")
    for needed, what in (
            ("del session._all_token_ids[num_computed_tokens:]",
             "cuts the session's tokens at num_computed_tokens"),
            ("session.max_tokens = update.max_tokens", "takes the update's max_tokens"),
            ("session.status = RequestStatus.WAITING", "sets the session back to WAITING")):
        if needed not in session:
            found.append(f"Scheduler._update_request_as_session no longer {what}")
    for name in ("schedule", "get_num_unfinished_requests"):
        if "num_waiting_for_streaming_input" not in source(name):
            found.append(f"Scheduler.{name} no longer reads num_waiting_for_streaming_input")
    return found
