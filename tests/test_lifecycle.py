"""A request's fork/join phases (vllm_seqhooks/engine/lifecycle.py): the
transitions a real scheduler makes, in order; an invalid transition raises;
the checker the surgical harness runs every step finds a phase that vLLM's
state contradicts."""

from __future__ import annotations

import pytest

from vllm_seqhooks.engine.lifecycle import InvalidTransition, Lifecycle, Phase, lifecycle_problems
from tests.support.sched_harness import (
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
            phase = st.phase
            if not seen or seen[-1][0] is not phase:
                seen.append((phase, hh.sched.fork_join.num_parked))

    h.after_update.append(record)
    h.run(max_steps=60)
    assert seen == [(Phase.RUNNING, 0), (Phase.PARKED, 1), (Phase.RUNNING, 0)]
    assert h.tokens["r"] == [40, P, 41, E, 42, S, 60, 61, 62, 43, EOS]
    assert h.sched.metrics.park_count == 1  # (its park timed from parked_since)


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
    with pytest.raises(InvalidTransition, match="needs spilled"):
        life.unspill(st)
    life.spill(st, 12)
    assert (st.phase, st.spilled_frontier, life.num_parked) == (Phase.SPILLED, 12, 1)
    with pytest.raises(InvalidTransition, match="needs parked"):
        life.spill(st, 12)
    life.unspill(st)
    assert (st.phase, st.spilled_frontier) == (Phase.PARKED, None)
    life.spill(st, 7)
    assert life.resume(st) == 7  # (how far its KV had reached)
    assert (st.phase, st.spilled_frontier, life.num_parked) == (Phase.RUNNING, None, 0)
    life.park(st, spilled_at=9)  # (vLLM preempted it in the step it stopped)
    life.kept(st)
    assert (st.phase, st.spilled_frontier) == (Phase.SPILLED, 9)
    life.forget(st)
    assert (st.phase, st.spilled_frontier, life.num_parked) == (Phase.RUNNING, None, 0)
    life.drain(st)
    with pytest.raises(InvalidTransition, match="needs running"):
        life.park(st)
    life.drained(st)
    assert st.phase is Phase.RUNNING and life.num_parked == 0


def test_phases_of_a_splice_join_under_kv_pressure():
    """A splice family on a small cache: the parent parks, is spilled while
    its children run, and resumes; its first child, which ends at its end
    tag, drains one step first. The harness checks the phases against
    vLLM's state at every step."""
    from tests.test_splice_scheduler import _pressured  # (its run asserts the output)

    seen: dict[str, list] = {}

    def record(hh, _outs):
        for rid in ("r", child_id("r", 0)):
            st = hh.sched.fork_join.states.get(rid)
            if st is not None and seen.setdefault(rid, [None])[-1] is not st.phase:
                seen[rid].append(st.phase)

    h = _pressured(22, on_update=record, enable_prefix_caching=True)
    assert h.sched.hook_stats["spills"] >= 1
    assert seen["r"][1:] == [Phase.RUNNING, Phase.PARKED, Phase.SPILLED, Phase.RUNNING]
    assert seen[child_id("r", 0)][1:] == [Phase.RUNNING, Phase.DRAINING]


@MODES
def test_the_checker_finds_a_phase_vllm_contradicts(async_sched):
    h = _parent_with_a_child(async_sched)
    fj = h.sched.fork_join
    h.run_until(lambda: "r" in fj.states and fj.states["r"].phase is Phase.PARKED)
    check_invariants(h.sched)  # consistent
    assert lifecycle_problems(h.sched.fork_join) == []
    fj.lifecycle.num_parked += 1
    assert lifecycle_problems(h.sched.fork_join) == ["2 counted parked, 1 in a parked phase"]
    with pytest.raises(InvariantError, match="counted parked"):
        check_invariants(h.sched)
    fj.lifecycle.num_parked -= 1
    fj.states["r"].phase = Phase.RUNNING  # (not through a transition)
    assert any("r is running but parked_since" in p
               for p in lifecycle_problems(h.sched.fork_join))


@MODES
def test_the_checker_finds_a_quiet_index_the_requests_contradict(async_sched):
    """The quiet path's engine-wide indexes are recounted from the
    requests' own fields at every step."""
    h = _parent_with_a_child(async_sched)
    fj = h.sched.fork_join
    h.run_until(lambda: child_id("r", 0) in fj.states)
    assert fj.quiet_problems() == []
    st = fj.states["r"]
    watch_stop = st.watch_stop
    st.watch_stop = not watch_stop  # (not through refresh_quiet)
    assert any(p.startswith("stop_watch") for p in fj.quiet_problems())
    with pytest.raises(InvariantError, match="stop_watch"):
        check_invariants(h.sched)
    st.watch_stop = watch_stop
    fj.loud.add("gone")
    assert any(p.startswith("loud") for p in fj.quiet_problems())
