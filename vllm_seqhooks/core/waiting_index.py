"""What fair share reads of the waiting requests, kept through the waiting
queue's changes (pure, no vLLM import).

A step's share needs, of the waiting requests: which families wait and at
which priorities (the contenders, and whether another family as urgent
waits), the families and priorities of the waiting children (their holds),
and whether a request that is not a child arrived after a given fork (only
then may it preempt). :class:`WaitingIndex` keeps these as counts, changed
only by the requests that entered or left the queue since the last step
(:meth:`WaitingIndex.sync`, a difference of two sets), so that a step with
many requests waiting does not read each of them again. What needs the
requests one by one in queue order (the blocks each needs to start, for
the holds that depend on blocks, and the preemption pass) is read only
then, through ``in_order``.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from typing import NamedTuple


class WaitingKey(NamedTuple):
    """What the index keeps of one waiting request (none of it changes
    while the request waits)."""

    family: str
    priority: int
    is_child: bool
    #: Its place in the order the engine was given its requests (None:
    #: unknown, or a child).
    arrival: int | None


class WaitingIndex:
    """Counts of the waiting requests by family and priority (see the
    module docstring). ``queue`` gives the members (the queue's requests)
    in the order vLLM's admission reaches them; ``in_order`` their entries
    (``core.fair_share.Entry``) in that order; both only when asked."""

    def __init__(self, in_order: Callable[[], Sequence] = tuple,
                 queue: Callable[[], Iterable[Hashable]] = tuple) -> None:
        self.in_order = in_order
        self.queue = queue
        self._keys: dict[Hashable, WaitingKey | None] = {}
        #: Members not counted (their key was None), asked again at each sync.
        self._dormant: set[Hashable] = set()
        #: priority -> family -> waiting requests
        self._by_priority: dict[int, Counter[str]] = {}
        self._families: Counter[str] = Counter()
        self._children: Counter[tuple[str, int]] = Counter()
        #: Arrivals of the waiting requests that are not children (a
        #: max-heap with lazy deletion, and the live counts).
        self._arrivals: Counter[int | None] = Counter()
        self._latest: list[int] = []

    @classmethod
    def of(cls, entries: Sequence) -> "WaitingIndex":
        """The index of ``entries`` (``Entry`` objects, in queue order)."""
        index = cls(lambda: entries, lambda: range(len(entries)))
        for i, e in enumerate(entries):
            index._add(i, WaitingKey(e.family, e.priority, e.is_child,
                                     None if e.is_child else e.arrival))
        return index

    # ------------------------------------------------------------ changes
    def sync(self, members: Iterable[Hashable],
             key_of: Callable[[Hashable], WaitingKey | None]) -> None:
        """Make the index that of ``members`` (the queue's requests; a set
        is used as is): the ones that entered since the last sync get
        ``key_of(member)`` (None: not counted, e.g. a parked session;
        asked again at each sync while it stays), the ones that left go."""
        members = members if isinstance(members, (set, frozenset)) else set(members)
        known = self._keys
        for gone in known.keys() - members:
            key = known.pop(gone)
            if key is None:
                self._dormant.discard(gone)
            else:
                self._remove(key)
        for member in members - known.keys():
            self._add(member, key_of(member))
        for member in list(self._dormant):
            key = key_of(member)
            if key is not None:
                self._dormant.discard(member)
                self._add(member, key)

    def clear(self) -> None:
        self.__init__(self.in_order, self.queue)

    def _add(self, member: Hashable, key: WaitingKey | None) -> None:
        self._keys[member] = key
        if key is None:
            self._dormant.add(member)
            return
        self._by_priority.setdefault(key.priority, Counter())[key.family] += 1
        self._families[key.family] += 1
        if key.is_child:
            self._children[key.family, key.priority] += 1
        else:
            self._arrivals[key.arrival] += 1
            if key.arrival is not None:
                heapq.heappush(self._latest, -key.arrival)
                if len(self._latest) > 2 * len(self._arrivals) + 64:  # (drop the stale)
                    self._latest = [-a for a in self._arrivals if a is not None]
                    heapq.heapify(self._latest)

    def _remove(self, key: WaitingKey) -> None:
        _decrement(self._by_priority[key.priority], key.family)
        if not self._by_priority[key.priority]:
            del self._by_priority[key.priority]
        _decrement(self._families, key.family)
        if key.is_child:
            _decrement(self._children, (key.family, key.priority))
        else:
            _decrement(self._arrivals, key.arrival)

    # ------------------------------------------------------------ queries
    @property
    def families(self) -> Counter[str]:
        """Waiting requests by family (the families that wait)."""
        return self._families

    def keys_in_order(self) -> Iterator[WaitingKey]:
        """The counted members' keys in the order admission reaches them
        (the queue as it was at the last sync)."""
        keys = self._keys
        for member in self.queue():
            key = keys.get(member)
            if key is not None:
                yield key

    def has_non_children(self) -> bool:
        return bool(self._arrivals)

    def child_keys(self) -> list[tuple[str, int]]:
        """(family, priority) of the waiting children, each once."""
        return list(self._children)

    def others_wait(self, family: str, priority: int) -> bool:
        """Whether a request of a family other than ``family`` waits with
        priority ``priority`` or more urgent (lower)."""
        for level, families in self._by_priority.items():
            if level <= priority and len(families) > (family in families):
                return True
        return False

    def arrived_since(self, first: int) -> bool:
        """Whether a waiting request that is not a child arrived at or after
        ``first`` (or at an unknown place)."""
        if self._arrivals[None]:
            return True
        latest = self._latest
        while latest and not self._arrivals[-latest[0]]:
            heapq.heappop(latest)
        return bool(latest) and -latest[0] >= first


def _decrement(counter: Counter, key) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]
