"""Where a new child waits: ChildrenFirst places it by binary search over
the leading children it keeps count of, exactly where a scan of the queue
would (after its family's and older families' children, before the first
request that has not started), through every change vLLM makes to it."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

import pytest

from vllm_seqhooks.core.child_queue import ChildrenFirst


@dataclass(eq=False)
class Req:
    name: str
    arrival_time: float
    child: bool


def make_queue(*requests: Req) -> ChildrenFirst:
    queue = ChildrenFirst(is_child=lambda r: r.child)
    queue.extend(requests)
    return queue


def scan_index(queue, arrival_time: float) -> int:
    """The reference: after the last leading child that arrived no later."""
    index = 0
    for position, request in enumerate(queue):
        if not request.child:
            break
        if request.arrival_time <= arrival_time:
            index = position + 1
    return index


def true_leading(queue) -> int:
    count = 0
    for request in queue:
        if not request.child:
            break
        count += 1
    return count


def test_children_wait_family_by_family_ahead_of_new_requests():
    a1, a2, b1, new = Req("a1", 1.0, True), Req("a2", 1.0, True), Req("b1", 3.0, True), Req("n", 0.5, False)
    cases = [(1.0, 2),   # after its siblings
             (2.0, 2),   # between older and newer families
             (3.0, 3),   # after its own siblings
             (9.0, 3),   # never behind a request that has not started
             (0.1, 0)]   # ahead of newer families
    for arrival, index in cases:
        queue = make_queue(a1, a2, b1, new)
        child = Req("c", arrival, True)
        queue.insert_child(child)
        assert list(queue).index(child) == index, arrival
        assert queue.leading_children() == 4
    empty = make_queue()
    empty.insert_child(Req("c", 1.0, True))
    assert [r.name for r in empty] == ["c"]
    behind = make_queue(Req("n", 0.0, False))
    behind.insert_child(Req("c", 1.0, True))
    assert [r.name for r in behind] == ["c", "n"]


def test_every_deque_change_keeps_or_forgets_the_count():
    """Every method deque defines that can change it is overridden: a new
    one in a later Python fails here instead of corrupting the count."""
    read_only = {"copy", "count", "index", "maxlen", "__add__", "__mul__", "__rmul__",
                 "__contains__", "__getitem__", "__iter__", "__len__", "__reversed__",
                 "__repr__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__",
                 "__hash__", "__reduce__", "__copy__", "__class_getitem__", "__sizeof__",
                 "__init__", "__new__", "__bool__", "__getattribute__", "__doc__"}
    not_covered = [name for name in vars(deque)
                   if name not in read_only and name not in vars(ChildrenFirst)]
    assert not_covered == []


def _vllm_like_operations(seed: int, steps: int = 600):
    """What the scheduler does to its waiting queue: new requests appended,
    children appended then placed, requests taken from the front, skipped
    ones put back in order, a preempted request prepended (a child is then
    placed again), aborted ones removed, and (rarely) anything else."""
    rng = random.Random(seed)
    queue = ChildrenFirst(is_child=lambda r: r.child)
    clock = 0.0
    families = []
    for step in range(steps):
        op = rng.random()
        if op < 0.2:
            clock += 1.0
            families.append(clock)
            queue.append(Req(f"n{step}", clock, False))
        elif op < 0.5 and families:
            child = Req(f"c{step}", rng.choice(families), True)
            queue.append(child)
            assert queue.pop() is child
            queue.leading_children()
            expected = scan_index(queue, child.arrival_time)
            queue.insert_child(child)
            assert queue[expected] is child
        elif op < 0.7 and queue:
            taken = [queue.popleft() for _ in range(rng.randint(1, min(3, len(queue))))]
            if rng.random() < 0.5:  # skipped this step: put back in order
                skipped = deque()
                for request in taken:
                    skipped.appendleft(request)
                queue.extendleft(skipped)
        elif op < 0.8:
            request = Req(f"p{step}", rng.choice(families or [0.0]), rng.random() < 0.5)
            queue.appendleft(request)  # preempted
            if request.child:
                assert queue.popleft() is request
                queue.leading_children()
                expected = scan_index(queue, request.arrival_time)
                queue.insert_child(request)
                assert queue[expected] is request
        elif op < 0.9 and queue:
            doomed = set(rng.sample(list(queue), rng.randint(1, min(2, len(queue)))))
            kept = [r for r in queue if r not in doomed]  # vLLM's remove_requests
            queue.clear()
            queue.extend(kept)
        elif queue:
            rng.choice([lambda: queue.remove(queue[rng.randrange(len(queue))]),
                        lambda: queue.rotate(0),
                        lambda: queue.__delitem__(len(queue) - 1)])()
        yield queue


@pytest.mark.parametrize("seed", range(6))
def test_the_count_follows_what_vllm_does_to_the_queue(seed):
    counted = placed = 0
    for queue in _vllm_like_operations(seed):
        if queue._leading is None:
            continue
        counted += 1
        assert queue._leading == true_leading(queue)
        leading = [r.arrival_time for r in list(queue)[:queue._leading]]
        assert leading == sorted(leading)  # families wait oldest first
        placed += len(leading) > 1
    assert counted > 300 and placed > 100  # the count was used, on real queues


def test_vllms_fcfs_queue_methods_keep_the_count():
    """The engine's waiting queue is vLLM's FCFS queue and a ChildrenFirst:
    vLLM's own methods (add, pop, prepend, remove) keep the count right."""
    from vllm_seqhooks.engine import vllm_private

    assert vllm_private.scheduler_problems(vllm_private.releases.installed()) == []
    queue = vllm_private.children_first_queue(lambda r: r.child)
    kids = [Req(f"c{i}", float(i), True) for i in range(3)]
    plain = [Req(f"n{i}", 10.0 + i, False) for i in range(2)]
    for r in plain:
        queue.add_request(r)
    for child in kids:
        queue.insert_child(child)
    assert [r.name for r in queue] == ["c0", "c1", "c2", "n0", "n1"]
    assert queue.pop_request() is kids[0] and queue._leading == 2
    queue.prepend_request(kids[0])
    assert queue._leading == 3
    queue.prepend_requests([plain[1]])
    assert queue._leading == 0
    queue.remove_request(plain[1])
    assert queue.leading_children() == 3
    queue.remove_requests([kids[1]])
    late = Req("c9", 1.5, True)
    queue.insert_child(late)
    assert [r.name for r in queue] == ["c0", "c9", "c2", "n0", "n1"]
    assert queue._leading == true_leading(queue) == 3
