"""Fair share worked out per step without an entry per running request, and
holds decided per family and asked as vLLM's admission reaches each waiting
child (issue 20),
take the same decisions as the plan over every queued request written
plainly (:func:`reference_plan`, the policy of
``vllm_seqhooks.core.fair_share``'s docstring, one entry per waiting,
running and parked request).

* pure: :func:`plan` equals :func:`reference_plan` on random snapshots
  (priorities, blocks, arrivals, forks, parked parents);
* engine: at every step of fork bombs beside plain requests, the children
  the scheduler preempts are the reference plan's, and every waiting child
  vLLM's admission reaches is held back exactly when the reference plan
  holds it.
"""

from __future__ import annotations

import random
from typing import Mapping, Sequence

import pytest

from vllm_seqhooks.core.fair_share import Entry, FairSharePlan, plan


def reference_plan(waiting: Sequence[Entry], running: Sequence[Entry], *, max_running: int,
                   total_blocks: int, parked: Sequence[Entry] = (),
                   forked_after: Mapping[str, int] | None = None) -> FairSharePlan:
    forked_after = forked_after or {}
    families = {e.family for e in waiting} | {e.family for e in running}
    if len(families) < 2:
        return FairSharePlan()
    share = max(1, max_running // len(families))
    block_share = max(1, total_blocks // len(families))
    slots: dict[str, int] = {}
    blocks: dict[str, int] = {}
    for e in running:
        slots[e.family] = slots.get(e.family, 0) + 1
    for e in [*running, *parked]:
        blocks[e.family] = blocks.get(e.family, 0) + e.blocks

    def others_wait(family, priority, fitting):
        return any(o.family != family and o.priority <= priority
                   and (not fitting or o.blocks <= block_share) for o in waiting)

    def held(e):
        return ((slots.get(e.family, 0) >= share and others_wait(e.family, e.priority, False))
                or (blocks.get(e.family, 0) > block_share
                    and others_wait(e.family, e.priority, True)))

    out = FairSharePlan(share=share)
    admitted: dict[str, int] = {}
    deprived = []
    for e in waiting:
        if e.is_child and held(e):
            out.hold.append(e.request_id)
            continue
        if not e.is_child and slots.get(e.family, 0) + admitted.get(e.family, 0) < share:
            deprived.append(e)
        admitted[e.family] = admitted.get(e.family, 0) + 1
    free = max_running - len(running)
    forks = [forked_after[e.family] for e in running
             if e.is_child and e.family in forked_after] or [0]
    for d in deprived:
        if free > 0:
            free -= 1
            continue
        if d.arrival is not None and d.arrival < min(forks):
            continue
        best, best_excess = None, (0, 0)
        for e in reversed(running):
            if not e.is_child or e.request_id in out.preempt or e.priority < d.priority:
                continue
            if (e.family in forked_after and d.arrival is not None
                    and d.arrival < forked_after[e.family]):
                continue
            if slots.get(e.family, 0) <= 1:
                continue
            excess = (slots[e.family] - share, blocks.get(e.family, 0) - block_share)
            if excess[0] > 0 and excess > best_excess:
                best, best_excess = e, excess
        if best is None:
            if d.arrival is None or d.arrival >= max(forks):
                break
            continue
        out.preempt.append(best.request_id)
        slots[best.family] -= 1
        blocks[best.family] -= best.blocks
    return out


def _random_snapshot(rng: random.Random):
    families = [f"f{i}" for i in range(rng.randint(1, 6))]
    priorities = [0] if rng.random() < 0.5 else [0, 1, 2]
    running, waiting, parked = [], [], []
    forked_after, arrival = {}, 0
    for f in families:
        if rng.random() < 0.7:
            forked_after[f] = rng.randint(0, 20)
        if rng.random() < 0.4:
            parked.append(Entry(f, f, rng.choice(priorities), False, rng.randint(1, 30)))
        for i in range(rng.randint(0, 8)):
            running.append(Entry(f"{f}-r{i}", f, rng.choice(priorities), rng.random() < 0.8,
                                 rng.randint(0, 12)))
        for i in range(rng.randint(0, 4)):
            waiting.append(Entry(f"{f}-w{i}", f, rng.choice(priorities), True,
                                 rng.randint(1, 12)))
        if rng.random() < 0.2:  # its root waits too (preempted while its children run)
            waiting.append(Entry(f, f, rng.choice(priorities), False, rng.randint(1, 12),
                                 rng.randint(0, 20)))
    for i in range(rng.randint(0, 8)):
        arrival += rng.randint(0, 6)
        plain = Entry(f"p{i}", f"p{i}", rng.choice(priorities), False, rng.randint(1, 40),
                      None if rng.random() < 0.1 else arrival)
        waiting.insert(rng.randint(0, len(waiting)), plain)
    rng.shuffle(running)
    max_running = max(len(running), 1) + rng.choice([0, 0, 1, 3])
    return waiting, running, parked, forked_after, max_running, rng.choice([20, 60, 200])


def test_plan_equals_the_whole_queue_reference_on_random_snapshots():
    rng = random.Random(20)
    acted = {"hold": 0, "preempt": 0}
    for _ in range(3000):
        waiting, running, parked, forked_after, max_running, total = _random_snapshot(rng)
        kwargs = dict(max_running=max_running, total_blocks=total, parked=parked,
                      forked_after=forked_after)
        got = plan(waiting, running, **kwargs)
        want = reference_plan(waiting, running, **kwargs)
        assert (got.hold, got.preempt, got.share) == (want.hold, want.preempt, want.share), (
            waiting, running, parked, forked_after, max_running, total)
        acted["hold"] += bool(want.hold)
        acted["preempt"] += bool(want.preempt)
    # (the snapshots exercise both decisions)
    assert acted["hold"] > 300 and acted["preempt"] > 100, acted


# ------------------------------------------------------------- in the engine
def _reference_from_engine(sched) -> FairSharePlan:
    """The whole-queue plan from the scheduler's queues, one entry per
    request (each block counted once per family, parked parents first)."""
    from vllm.v1.request import RequestStatus

    from vllm_seqhooks.core.kv_blocks import blocks_to_start

    fj = sched.fork_join
    parked_status = RequestStatus.WAITING_FOR_STREAMING_REQ

    def family(rid):
        st = fj.states.get(rid)
        return st.family.root_id if st is not None and st.family is not None else rid

    waiting = [Entry(r.request_id, family(r.request_id), r.priority, r.request_id in fj.children,
                     blocks_to_start(r.num_tokens, r.num_computed_tokens, sched.block_size),
                     fj.arrival_order.get(r.request_id))
               for r in sched.waiting if r.status != parked_status]
    # Only children are held back or preempted, and only for a request that
    # is not one: no plan unless both are there.
    if (all(c.status == parked_status for c in fj.children.values())
            or all(e.is_child for e in waiting)):
        return FairSharePlan()
    seen: dict[str, set[int]] = {}

    def holding(req):
        rid = req.request_id
        ids = sched.kv_cache_manager.get_block_ids(rid)[0]
        st = fj.states.get(rid)
        if st is None or st.family is None:
            n = len(ids)
        else:
            new = set(ids) - seen.setdefault(family(rid), set())
            seen[family(rid)] |= new
            n = len(new)
        return Entry(rid, family(rid), req.priority, rid in fj.children, n)

    parked = [holding(st.request) for st in fj.states.values()
              if st.parked and st.spilled_frontier is None]
    running = [holding(r) for r in sched.running]
    forked = {f: ledger.forked_after for f, ledger in fj.families.items()
              if ledger.forked_after is not None}
    return reference_plan(waiting, running, max_running=sched.max_num_running_reqs,
                          total_blocks=sched.kv_cache_manager.block_pool.num_gpu_blocks,
                          parked=parked, forked_after=forked)


@pytest.mark.parametrize("case", ["late_plain", "batch", "priorities", "tight_kv"])
def test_engine_holds_and_preemptions_equal_the_whole_queue_plan(case):
    from tests.support.sched_harness import (
        EOS_ID as EOS, PROMISE_END_ID as E, PROMISE_ID as P, SYNC_ID as S, SchedHarness,
        child_id)

    rng = random.Random(case)
    blocks = 90 if case == "tight_kv" else 600
    h = SchedHarness(False, num_blocks=blocks, max_num_seqs=8, block_size=16,
                     max_model_len=400, policy=(
                         "priority" if case == "priorities" else "fcfs"),
                     hooks={"max_children_per_request": 6, "max_descendants": 12,
                            "max_live_children": 1 << 20, "family_token_factor": 64})
    sched = h.sched
    compared = {"steps": 0, "reached": 0, "held": 0, "preempted": 0, "preempted_reached": 0}
    step_plan: list[FairSharePlan] = []
    hold_over_share = sched.fair_share.hold_over_share
    holds_back = sched.fair_share.holds_back

    def checked_hold_over_share():
        want = _reference_from_engine(sched)
        hold_over_share()
        step = sched.fork_join.share_step
        got = step.preempt if step is not None else []
        assert got == want.preempt
        step_plan[:] = [want]
        compared["steps"] += 1
        compared["preempted"] += len(got)

    def checked_holds_back(request):
        rid = request.request_id
        if (rid in sched.fork_join.children and not request.num_computed_tokens
                and rid not in sched.fork_join.share_step.preempt):
            # decided before vLLM's schedule, on the holdings before it
            family = sched.fair_share._family(rid)
            assert (family, request.priority) in sched.fork_join.share_step._memo, rid
        got = holds_back(request)
        if request.request_id in sched.fork_join.share_step.preempt:
            # a child preempted for this step's share is not admitted again in it
            assert got, request.request_id
            compared["preempted_reached"] += 1
        elif (request.request_id in sched.fork_join.children
                and request.status.name != "WAITING_FOR_STREAMING_REQ"):
            assert got == (request.request_id in step_plan[0].hold), request.request_id
            compared["reached"] += 1
            compared["held"] += got
        return got

    sched.fair_share.hold_over_share = checked_hold_over_share
    sched.fair_share.holds_back = checked_holds_back

    def bomb(rid, n, priority=0):
        script = [20]
        for j in range(n):
            script += [P, 41 + j, E]
        h.add(rid, [10 + len(rid) % 7] * 20, script=script + [S, 50, EOS], max_tokens=200,
              priority=priority)
        for j in range(n):
            h.scripts[child_id(rid, j)] = [60 + j] * rng.randint(10, 40) + [EOS]

    def plain(rid, priority=0):
        h.add(rid, [30 + len(rid) % 9] * rng.randint(8, 40), script=[70] * rng.randint(3, 12)
              + [EOS], max_tokens=40, priority=priority)

    if case == "batch":  # all given at once (GRPO-like)
        for i in range(6):
            bomb(f"b{i}", 5)
        for i in range(6):
            plain(f"p{i}")
    else:
        bomb("b0", 6)
        bomb("b1", 4, priority=1 if case == "priorities" else 0)
    for step in range(400):
        if case != "batch" and step in (6, 9, 14, 30):
            plain(f"late{step}", priority=2 if case == "priorities" and step == 9 else 0)
            bomb(f"c{step}", 3)
        if not sched.requests:
            break
        h.step()
    assert not sched.requests
    assert compared["steps"] > 5 and compared["reached"] > 0, compared
    assert compared["held"] > 0, compared
    # A batch given at once preempts nothing (every request came before the
    # families forked); requests arriving later do.
    assert (compared["preempted"] == 0) == (case == "batch"), compared
    assert (compared["preempted_reached"] > 0) == (case != "batch"), compared


def test_waiting_index_kept_through_changes_equals_one_built_afresh():
    """The waiting side of the share, kept through a queue's changes
    (requests entering and leaving, a parked session waking up) answers as
    an index built from the queue as it is: the same families, the same
    answer to "does another family as urgent wait", the same waiting
    children's families, the same "did a request arrive after this fork"."""
    from vllm_seqhooks.core.waiting_index import WaitingIndex, WaitingKey

    rng = random.Random(7)
    keys: dict[int, WaitingKey] = {}
    dormant: set[int] = set()
    kept = WaitingIndex()
    next_id = 0
    for _ in range(400):
        for _ in range(rng.randint(0, 6)):  # requests enter
            fam = f"f{rng.randint(0, 8)}"
            child = rng.random() < 0.6
            keys[next_id] = WaitingKey(fam if child else f"r{next_id}", rng.choice([0, 0, 1, 2]),
                                       child, None if child else rng.choice([None, *range(50)]))
            if rng.random() < 0.1:
                dormant.add(next_id)
            next_id += 1
        for member in rng.sample(sorted(keys), k=min(len(keys), rng.randint(0, 5))):
            del keys[member]  # requests leave
            dormant.discard(member)
        if dormant and rng.random() < 0.3:
            dormant.pop()  # a parked session wakes up
        kept.sync(set(keys), lambda m: None if m in dormant else keys[m])
        live = [k for m, k in keys.items() if m not in dormant]
        fresh = WaitingIndex()
        fresh.sync(set(range(len(live))), lambda i: live[i])
        assert kept.families == fresh.families
        assert sorted(kept.child_keys()) == sorted(fresh.child_keys())
        assert kept.has_non_children() == fresh.has_non_children()
        for fam in [f"f{i}" for i in range(9)] + ["r1", "zz"]:
            for priority in (0, 1, 2):
                want = any(k.family != fam and k.priority <= priority for k in live)
                assert kept.others_wait(fam, priority) == want
        for first in (0, 10, 25, 49, 60):
            want = any(not k.is_child and (k.arrival is None or k.arrival >= first)
                       for k in live)
            assert kept.arrived_since(first) == want
