"""A bounded memory of ids recently seen, to refuse their reuse in constant space.

The reference remembers the last 4096 finished request ids, closed session ids and delegate ids
(design.md, host 2.5, 4.1); so do both connections.

Numeric ids (request and delegate ids, 1 to 2**63 - 1) are kept in two arrays of machine
integers (`RecentNumbers`), not as Python objects: each decoded id is a small object that
pymalloc places wherever a block was free when its frame arrived, and a book that keeps 4096 of
them, allocated while a thousand cells came and went, pinned a few of them in most of the
1 MiB arenas those cells had used: the host kept about 15 MiB it no longer needed after the
cells ended (docs/performance-history.md, second round). Session ids are strings (`RecentIds`).
"""

from __future__ import annotations

import array
import bisect
import collections
from collections.abc import Hashable

RECENT_IDS = 4096


class RecentIds:
    """The last `RECENT_IDS` values added."""

    __slots__ = ("_order", "_set")

    def __init__(self) -> None:
        self._order: collections.deque[Hashable] = collections.deque()
        self._set: set[Hashable] = set()

    def add(self, value: Hashable) -> None:
        if len(self._order) == RECENT_IDS:
            self._set.discard(self._order.popleft())
        self._order.append(value)
        self._set.add(value)

    def __contains__(self, value: object) -> bool:
        return value in self._set


class RecentNumbers:
    """The last `RECENT_IDS` integers added (each between -2**63 and 2**63 - 1), held without
    a Python object per value: a ring in the order added, and the same values sorted (looked up
    by bisection; ids that only grow are appended at its end).

    The sorted values start at `_start`: the values before it were forgotten. Ids that only grow
    forget the smallest each time, and deleting it would move the 4095 values after it (32 KB a
    call, once the book is full); the start moves instead, and the forgotten values are cut off
    once there are `RECENT_IDS` of them, one move every `RECENT_IDS` calls.
    """

    __slots__ = ("_next", "_ring", "_sorted", "_start")

    def __init__(self) -> None:
        self._ring = array.array("q")
        self._sorted = array.array("q")
        self._next = 0  # the ring's oldest value once it is full
        self._start = 0

    def add(self, value: int) -> None:
        ring, ordered = self._ring, self._sorted
        if len(ring) < RECENT_IDS:
            ring.append(value)
        else:
            start, oldest = self._start, ring[self._next]
            if ordered[start] == oldest:
                start += 1
                if start == RECENT_IDS:
                    del ordered[:start]
                    start = 0
                self._start = start
            else:
                del ordered[bisect.bisect_left(ordered, oldest, start)]
            ring[self._next] = value
            self._next = (self._next + 1) % RECENT_IDS
        if len(ordered) == self._start or value >= ordered[-1]:
            ordered.append(value)
        else:
            ordered.insert(bisect.bisect_left(ordered, value, self._start), value)

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, int):
            return False
        ordered = self._sorted
        if len(ordered) == self._start or value > ordered[-1]:
            return False  # a new id of ids that only grow: no bisection
        i = bisect.bisect_left(ordered, value, self._start)
        return i < len(ordered) and ordered[i] == value
