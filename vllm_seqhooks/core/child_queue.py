"""Where a new child waits (pure logic, no vLLM import).

Children wait ahead of every request that has not started: a parked
parent's children must be able to run. Among themselves they wait family
by family, oldest family first (a child's arrival time is its family's),
each family's children in the order they were spawned. Siblings share
their parent's context through the prefix cache, so a family whose
children run together holds that context once and for the shortest time;
children spawned one at a time by several families would otherwise
interleave (child 0 of every family, then child 1, ...) and, with a tight
KV cache, run one per family, each holding its own family's context.

:class:`ChildrenFirst` is a deque (the type of vLLM's FCFS waiting queue)
that keeps count of its leading children through every change made to it,
so that a child finds its place with a binary search over them instead of
a scan of the queue. The engine subclasses it with vLLM's queue class
(``vllm_private.children_first_queue``).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterable
from itertools import takewhile
from typing import Any


def _arrival(request: Any) -> float:
    return request.arrival_time


def _never(request: Any) -> bool:
    return False


class ChildrenFirst(deque):
    """A deque of requests that knows how many of its leading requests are
    children (``is_child``), so that :meth:`insert_child` places a child
    after the leading children of its family and of older families, before
    the first request that is not a child, in O(log n).

    Every mutating deque method keeps the count or, where keeping it would
    cost a scan, forgets it; a forgotten count is recounted (a scan of the
    leading children only) by the next :meth:`insert_child`. The leading
    children are ordered by arrival time: children enter only through
    :meth:`insert_child`, vLLM's own moves keep their order (it takes
    requests from the front and puts skipped ones back in order), and a
    recount puts them back in order when a request that was in front of
    some of them has gone.
    """

    def __init__(self, iterable: Iterable[Any] = (), maxlen: int | None = None,
                 is_child: Callable[[Any], bool] = _never) -> None:
        super().__init__(iterable, maxlen)
        self.is_child = is_child
        self._leading: int | None = None

    # --------------------------------------------------------- the count
    def leading_children(self) -> int:
        """How many requests at the front are children. Recounting them
        also puts them back in arrival order if a request that went ahead
        of older children (a preempted parent vLLM put back at the front)
        has left since."""
        if self._leading is None:
            run = list(takewhile(self.is_child, self))
            if any(a.arrival_time > b.arrival_time for a, b in zip(run, run[1:])):
                for _ in run:
                    deque.popleft(self)
                deque.extendleft(self, reversed(sorted(run, key=_arrival)))
            self._leading = len(run)
        return self._leading

    def insert_child(self, child: Any) -> None:
        """Queue ``child`` after the leading children that arrived no later
        (its family's and older families'), before any request that is not
        a child."""
        leading = self.leading_children()
        deque.insert(self, bisect_right(self, child.arrival_time, 0, leading, key=_arrival),
                     child)
        self._leading = leading + 1

    # ------------------------------------------- deque changes, counted
    def append(self, request: Any) -> None:
        if self._leading == len(self) and self.is_child(request):
            self._leading += 1
        super().append(request)

    def appendleft(self, request: Any) -> None:
        if not self.is_child(request):
            self._leading = 0
        elif self._leading is not None:
            self._leading += 1
        super().appendleft(request)

    def extendleft(self, requests: Iterable[Any]) -> None:
        requests = list(requests)
        front = 0  # children at the front once extended (the last ones given)
        for request in reversed(requests):
            if not self.is_child(request):
                break
            front += 1
        if front < len(requests):
            self._leading = front
        elif self._leading is not None:
            self._leading += front
        super().extendleft(requests)

    def pop(self) -> Any:
        if self._leading and self._leading == len(self):
            self._leading -= 1
        return super().pop()

    def popleft(self) -> Any:
        request = super().popleft()
        if self._leading:
            self._leading -= 1
        else:
            self._leading = None  # a non-child left the front: count again
        return request

    def clear(self) -> None:
        super().clear()
        self._leading = 0

    # -------------------------------------- deque changes, count forgotten
    def extend(self, requests: Iterable[Any]) -> None:
        self._leading = None
        super().extend(requests)

    def insert(self, index: int, request: Any) -> None:
        self._leading = None
        super().insert(index, request)

    def remove(self, request: Any) -> None:
        self._leading = None
        super().remove(request)

    def rotate(self, n: int = 1) -> None:
        self._leading = None
        super().rotate(n)

    def reverse(self) -> None:
        self._leading = None
        super().reverse()

    def __setitem__(self, index: Any, request: Any) -> None:
        self._leading = None
        super().__setitem__(index, request)

    def __delitem__(self, index: Any) -> None:
        self._leading = None
        super().__delitem__(index)

    def __iadd__(self, requests: Iterable[Any]):
        self.extend(requests)
        return self

    def __imul__(self, n: int):
        self._leading = None
        return super().__imul__(n)
