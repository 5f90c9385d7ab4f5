"""A request's fork/join phases (vllm_seqhooks/engine/lifecycle.py): the
transitions a real scheduler makes, in order; an invalid transition raises;
the checker the surgical harness runs every step finds a phase that vLLM's
state contradicts."""

from __future__ import annotations

import pytest

from vllm_seqhooks.engine.lifecycle import InvalidTransition, Lifecycle, Phase, lifecycle_problems
from vllm_seqhooks.testing.sched_harness import (
    EOS_ID as EOS,
    PROMISE_END_ID as E,
    PROMISE_ID as P,
    SYNC_ID as S,
    InvariantError,
    SchedHarness,
    child_id,
    check_invariants,
)


MODES = pytest.mark.parametrize("async_sched", [False, True], ids=["sync", "async"])


def _parent_with_a_child(async_sched: bool) -> SchedHarness:
    h = SchedHarness(async_sched, block_size=16)
    h.add("r", list(range(1, 21)), max_tokens=30, script=[40, P, 41, E, 42, S, 43, EOS])
    h.scripts[child_id("r", 0)] = [60, 61, 62, EOS]
    return h


@MODES
def test_phases_of_a_fork_and_join(async_sched):
    """running -> (parking, within the step) -> parked while the child runs
    -> running after the join; the parked count follows."""
    h = _parent_with_a_child(async_sched)
    seen = []

    def record(hh, _outs):
        st = hh.sched.fork_join.states.get("r")
        if st is not None:
            phase = hh.sched.fork_join.lifecycle.phase_of(st)
            if not seen or seen[-1][0] is not phase:
                seen.append((phase, hh.sched.fork_join.num_parked))

    h.after_update.append(record)
    h.run(max_steps=60)
    assert seen == [(Phase.RUNNING, 0), (Phase.PARKED, 1), (Phase.RUNNING, 0)]
    assert h.tokens["r"] == [40, P, 41, E, 42, S, 60, 61, 62, 43, EOS]


def test_an_invalid_transition_raises():
    from types import SimpleNamespace

    st = SimpleNamespace(phase=Phase.RUNNING, spilled_frontier=None,
                         request=SimpleNamespace(request_id="r"))
    life = Lifecycle()
    with pytest.raises(InvalidTransition, match="r: running -> running"):
        life.resume(st)
    with pytest.raises(InvalidTransition, match="needs parking"):
        life.kept(st)
    life.park(st)
    assert (st.phase, life.num_parked, life.take_parked_this_step()) == (Phase.PARKING, 1, {"r"})
    with pytest.raises(InvalidTransition):
        life.park(st)
    life.kept(st)
    st.spilled_frontier = 12
    assert life.phase_of(st) is Phase.SPILLED
    life.resume(st)
    assert (st.phase, life.num_parked) == (Phase.RUNNING, 0)
    life.park(st)
    life.forget(st)
    assert (st.phase, life.num_parked) == (Phase.RUNNING, 0)


@MODES
def test_the_checker_finds_a_phase_vllm_contradicts(async_sched):
    h = _parent_with_a_child(async_sched)
    fj = h.sched.fork_join
    h.run_until(lambda: "r" in fj.states and fj.states["r"].phase is Phase.PARKED)
    check_invariants(h.sched)  # consistent
    assert lifecycle_problems(h.sched) == []
    fj.lifecycle.num_parked += 1
    assert lifecycle_problems(h.sched) == ["2 counted parked, 1 in a parked phase"]
    with pytest.raises(InvariantError, match="counted parked"):
        check_invariants(h.sched)
    fj.lifecycle.num_parked -= 1
    fj.states["r"].phase = Phase.RUNNING  # (not through a transition)
    assert any("r is running but its node blocked=True" in p for p in lifecycle_problems(h.sched))
