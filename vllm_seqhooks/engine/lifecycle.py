"""Where a request with hooks is in its fork/join life: its phase, held in
one place (``HookState.phase``), changed only by the named transitions of
:class:`Lifecycle`, each saying what it requires and what it changes (an
invalid one raises :class:`InvalidTransition`). What other code asked
through separate flags and counters (parked, spilled and its frontier,
draining, parked this step, the number parked) is read from here.

::

    RUNNING --park--> PARKING --kept--> PARKED --spill--> SPILLED
       ^  |          (this step)          |  ^--unspill--'   |
       |  '--drain--> DRAINING             '----resume--------'--> RUNNING
       '---drained---'   (one step)

- RUNNING: in vLLM's hands like any request (queued, running, preempted).
  ``sampling.Sampling`` (its stop, or a ``<sync>``/fork tag it sampled
  with open children) calls ``parking.Parking.park`` -> :meth:`park`.
- PARKING: stopped in this step, to be kept rather than finished; vLLM's
  stop handler keeps it (``scheduler._handle_stopped_request`` ->
  ``vllm_private.park_stopped``) -> :meth:`kept`, in the same step.
- PARKED: waiting for its children outside vLLM's queues, its KV blocks
  held.
- SPILLED: parked, its KV blocks given back to the prefix cache
  (``parking.Parking.spill``, asked by ``kv_pressure.KVPressure``, or
  parked so when vLLM preempted it in the step it stopped):
  ``HookState.spilled_frontier`` says how far its KV went. A splice join
  that takes blocks again -> :meth:`unspill`.
- Its join (``joins.Joins._take_merge``) -> :meth:`resume` from PARKED or
  SPILLED: it runs again, or finishes, with the merged tokens.
- DRAINING: a splice join's child that wrote its end tag computes the
  tag's KV in one more step (``sampling.Sampling.apply_events`` ->
  :meth:`drain`; its next step -> :meth:`drained`, and it finishes).

A request leaves (any phase) with its hook state (``ForkJoinState.drop_state``
-> :meth:`forget`). :func:`lifecycle_problems` recounts, from vLLM's own
state, what the phases say; the surgical tests run it every step.
"""

from __future__ import annotations

import enum
import time
from typing import Any

#: A request's hook state (``vllm_seqhooks.engine.state.HookState``, which
#: holds the phase; named here only, so that the two modules do not import
#: each other).
HookState = Any


class Phase(enum.Enum):
    RUNNING = "running"
    PARKING = "parking"
    PARKED = "parked"
    SPILLED = "spilled"
    DRAINING = "draining"


#: Phases of a request that waits for its children (it is "parked").
WAITING_FOR_CHILDREN = frozenset({Phase.PARKING, Phase.PARKED, Phase.SPILLED})
#: Those of them in which it still holds its KV blocks (not spilled).
PARKED_WITH_BLOCKS = frozenset({Phase.PARKING, Phase.PARKED})


class InvalidTransition(RuntimeError):
    """A transition asked of a request in a phase it does not start from."""


class Lifecycle:
    """The transitions between phases, and what is counted from them."""

    def __init__(self) -> None:
        #: Requests in a phase of WAITING_FOR_CHILDREN.
        self.num_parked = 0
        #: Requests that parked in the current step (their outputs of the
        #: step lose their finish reason); taken by :meth:`take_parked_this_step`.
        self.parked_this_step: set[str] = set()

    @staticmethod
    def _move(st: HookState, starts: tuple[Phase, ...], end: Phase) -> None:
        if st.phase not in starts:
            raise InvalidTransition(
                f"{st.request.request_id}: {st.phase.value} -> {end.value} "
                f"(needs {' or '.join(p.value for p in starts)})")
        st.phase = end

    def park(self, st: HookState, spilled_at: int | None = None) -> None:
        """RUNNING -> PARKING: it stopped in this step with open children
        (requires: running). Counted as parked, since now; its outputs of
        this step lose their finish reason. ``spilled_at``: vLLM preempted it while the step
        was in flight (its blocks are gone); it parks spilled, its KV having
        reached that token."""
        self._move(st, (Phase.RUNNING,), Phase.PARKING)
        st.spilled_frontier = spilled_at
        st.parked_since = time.time()
        self.num_parked += 1
        self.parked_this_step.add(st.request.request_id)

    def kept(self, st: HookState) -> None:
        """PARKING -> PARKED (or SPILLED, parked so): vLLM kept it (requires:
        parking, in the step it parked)."""
        self._move(st, (Phase.PARKING,),
                   Phase.PARKED if st.spilled_frontier is None else Phase.SPILLED)

    def spill(self, st: HookState, frontier: int) -> None:
        """PARKED -> SPILLED: its KV blocks went back to the pool; its KV
        had reached token ``frontier`` (requires: parked, holding blocks)."""
        self._move(st, (Phase.PARKED,), Phase.SPILLED)
        st.spilled_frontier = frontier

    def unspill(self, st: HookState) -> None:
        """SPILLED -> PARKED: it holds KV blocks again (a splice join took
        them; requires: spilled)."""
        self._move(st, (Phase.SPILLED,), Phase.PARKED)
        st.spilled_frontier = None

    def resume(self, st: HookState) -> int | None:
        """PARKED or SPILLED -> RUNNING: its children are joined; it runs, or
        finishes, with the merge. Returns how far its KV had reached when it
        was spilled (None: it holds its blocks)."""
        self._move(st, (Phase.PARKED, Phase.SPILLED), Phase.RUNNING)
        self.num_parked -= 1
        frontier, st.spilled_frontier = st.spilled_frontier, None
        st.parked_since = None
        return frontier

    def drain(self, st: HookState) -> None:
        """RUNNING -> DRAINING: it wrote its end tag and computes the tag's
        KV in one more step (requires: running)."""
        self._move(st, (Phase.RUNNING,), Phase.DRAINING)

    def drained(self, st: HookState) -> None:
        """DRAINING -> RUNNING: the step that computed its end tag's KV came;
        it finishes now (requires: draining)."""
        self._move(st, (Phase.DRAINING,), Phase.RUNNING)

    def forget(self, st: HookState) -> None:
        """It leaves, from any phase (aborted, finished, freed)."""
        if st.phase in WAITING_FOR_CHILDREN:
            self.num_parked -= 1
        st.phase = Phase.RUNNING
        st.spilled_frontier = None
        st.parked_since = None

    def take_parked_this_step(self) -> set[str]:
        taken, self.parked_this_step = self.parked_this_step, set()
        return taken


def lifecycle_problems(fork_join: Any) -> list[str]:
    """What vLLM's state says that the phases do not (between steps): the
    parked count is the number of requests in a parked phase; none is still
    PARKING; a parked request is vLLM's waiting session, with the time it
    parked, and has open children; a running one is neither; a spilled one
    holds no computed tokens and has its frontier, any other none; a
    draining one is a child."""
    from vllm.v1.request import RequestStatus

    lifecycle = fork_join.lifecycle
    found = []
    parked = 0
    for rid, st in fork_join.states.items():
        phase = st.phase
        session = st.request.status == RequestStatus.WAITING_FOR_STREAMING_REQ
        waiting = st.parked_since is not None
        if phase is Phase.PARKING:
            found.append(f"{rid} is still parking between steps")
        if phase in WAITING_FOR_CHILDREN:
            parked += 1
            if not (session and waiting and fork_join.tree.has_open_children(rid)):
                found.append(f"{rid} is {phase.value} but vLLM status "
                             f"{st.request.status.name}, parked_since {st.parked_since}, "
                             f"open children {fork_join.tree.has_open_children(rid)}")
        elif waiting or (session and not st.request.is_finished()):
            found.append(f"{rid} is {phase.value} but parked_since {st.parked_since}, "
                         f"vLLM status {st.request.status.name}")
        if (phase is Phase.SPILLED) != (st.spilled_frontier is not None):
            found.append(f"{rid} is {phase.value} with spilled frontier {st.spilled_frontier}")
        if phase is Phase.SPILLED and st.request.num_computed_tokens:
            found.append(f"{rid} is spilled with {st.request.num_computed_tokens} computed tokens")
        if phase is Phase.DRAINING and rid not in fork_join.children:
            found.append(f"{rid} is draining but is not a child")
    if parked != lifecycle.num_parked:
        found.append(f"{lifecycle.num_parked} counted parked, {parked} in a parked phase")
    return found
