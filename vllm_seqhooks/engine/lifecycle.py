"""Where a request with hooks is in its fork/join life: its phase, held in
one place (``HookState.phase``), changed only by the named transitions of
:class:`Lifecycle`, each saying what it requires and what it changes (an
invalid one raises :class:`InvalidTransition`). What other code asked
through separate flags and counters (parked, parked pending, parked this
step, the number parked) is read from here.

::

    RUNNING --park--> PARKING --kept--> PARKED --resume--> RUNNING
                  (this step)         (SPILLED: PARKED whose KV blocks
                                       were given back, see phase_of)

- RUNNING: in vLLM's hands like any request (queued, running, preempted).
  ``sampling.Sampling`` (its stop, or a ``<sync>``/fork tag it sampled
  with open children) calls ``parking.Parking.park`` -> :meth:`park`.
- PARKING: stopped in this step, to be kept rather than finished; vLLM's
  stop handler keeps it (``scheduler._handle_stopped_request`` ->
  ``vllm_private.park_stopped``) -> :meth:`kept`, in the same step.
- PARKED: waiting for its children outside vLLM's queues, its KV blocks
  held (or, SPILLED, given back to the prefix cache by ``kv_pressure``:
  ``HookState.spilled_frontier`` is set). Its join
  (``joins.Joins._take_merge`` / ``_finish_after_join``) -> :meth:`resume`;
  it then runs again (or finishes) with the merged tokens.

A request leaves (any phase) with its hook state (``ForkJoinState.drop_state``
-> :meth:`forget`). :func:`lifecycle_problems` recounts, from vLLM's own
state, what the phases say; the surgical tests run it every step.
"""

from __future__ import annotations

import enum
from typing import Any

#: A request's hook state (``vllm_seqhooks.engine.state.HookState``, which
#: holds the phase; named here only, so that the two modules do not import
#: each other).
HookState = Any


class Phase(enum.Enum):
    RUNNING = "running"
    PARKING = "parking"
    PARKED = "parked"
    SPILLED = "spilled"  # (derived: PARKED whose blocks were given back)


#: Phases of a request that waits for its children (it is "parked").
WAITING_FOR_CHILDREN = frozenset({Phase.PARKING, Phase.PARKED})


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
    def phase_of(st: HookState) -> Phase:
        """``st``'s phase, SPILLED told apart from PARKED."""
        if st.phase is Phase.PARKED and st.spilled_frontier is not None:
            return Phase.SPILLED
        return st.phase

    def _move(self, st: HookState, start: Phase, end: Phase) -> None:
        if st.phase is not start:
            raise InvalidTransition(
                f"{st.request.request_id}: {st.phase.value} -> {end.value} (needs {start.value})")
        st.phase = end

    def park(self, st: HookState) -> None:
        """RUNNING -> PARKING: it stopped in this step with open children
        (requires: running). Counted as parked; its outputs of this step lose
        their finish reason."""
        self._move(st, Phase.RUNNING, Phase.PARKING)
        self.num_parked += 1
        self.parked_this_step.add(st.request.request_id)

    def kept(self, st: HookState) -> None:
        """PARKING -> PARKED: vLLM kept it with its blocks (requires:
        parking, in the step it parked)."""
        self._move(st, Phase.PARKING, Phase.PARKED)

    def resume(self, st: HookState) -> None:
        """PARKED -> RUNNING: its children are joined (requires: parked,
        spilled or not); it runs, or finishes, with the merge."""
        self._move(st, Phase.PARKED, Phase.RUNNING)
        self.num_parked -= 1

    def forget(self, st: HookState) -> None:
        """It leaves, from any phase (aborted, finished, freed)."""
        if st.phase in WAITING_FOR_CHILDREN:
            self.num_parked -= 1
        st.phase = Phase.RUNNING

    def take_parked_this_step(self) -> set[str]:
        taken, self.parked_this_step = self.parked_this_step, set()
        return taken


def lifecycle_problems(sched: Any) -> list[str]:
    """What vLLM's state and the request tree say that the phases do not
    (between steps): the parked count is the number of requests in a parked
    phase; none is still PARKING; a parked request is vLLM's waiting
    session and its tree node is blocked; a running one is neither; a
    spilled one holds no computed tokens."""
    from vllm.v1.request import RequestStatus

    fork_join = sched.fork_join
    lifecycle = fork_join.lifecycle
    found = []
    parked = 0
    for rid, st in fork_join.states.items():
        phase = lifecycle.phase_of(st)
        node = fork_join.tree.get(rid)
        blocked = node is not None and node.blocked
        session = st.request.status == RequestStatus.WAITING_FOR_STREAMING_REQ
        if phase is Phase.PARKING:
            found.append(f"{rid} is still parking between steps")
        if st.phase in WAITING_FOR_CHILDREN:
            parked += 1
            if not (blocked and session):
                found.append(f"{rid} is {phase.value} but its node blocked={blocked}, "
                             f"vLLM status {st.request.status.name}")
        elif blocked or (session and not st.request.is_finished()):
            found.append(f"{rid} is running but its node blocked={blocked}, "
                         f"vLLM status {st.request.status.name}")
        if phase is Phase.SPILLED and st.request.num_computed_tokens:
            found.append(f"{rid} is spilled with {st.request.num_computed_tokens} computed tokens")
    if parked != lifecycle.num_parked:
        found.append(f"{lifecycle.num_parked} counted parked, {parked} in a parked phase")
    return found
