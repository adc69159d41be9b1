"""A bounded memory of ids recently seen, to refuse their reuse in constant space.

The reference remembers the last 4096 finished request ids, closed session ids and delegate ids
(reference-host 2.5, 4.1); so do both connections.
"""

from __future__ import annotations

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
