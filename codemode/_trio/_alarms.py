"""Many deadlines, one task: `Alarms.call_at(when, fn)` runs `fn` once trio's clock reaches
`when`.

Why not a cancel scope with a deadline per waiter: in this interpreter a cancel scope entered and
left costs about 48,000 instructions, as much as a pass of the scheduler with a task step
(`docs/performance-history.md`, seventh round), and most deadlines are cancelled long before
they come (an observation window of 10 s around a cell that ends in a millisecond). Here a
deadline is an entry in a heap; one task sleeps until the earliest, in a scope whose deadline an
earlier entry moves.

Rules:
1. `fn` runs in the alarms' task, at `when` or later, never earlier; it is a plain callable and
   must not block.
2. A cancelled alarm never runs, and drops its function at once: nothing `fn` refers to is kept
   alive by a cancelled alarm. Cancelled entries leave the heap when they reach its top, or
   all at once when they are most of it.
3. An exception of `fn` is logged, and the other alarms run.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from collections.abc import Callable

import trio

logger = logging.getLogger("codemode.alarms")

_COMPACT_AT = 64
"""Past this many cancelled entries, the heap is compacted as soon as they are half of it."""


class Alarm:
    """One `call_at`: cancel it with `cancel()`."""

    __slots__ = ("_alarms", "fn", "when")

    def __init__(self, alarms: Alarms, when: float, fn: Callable[[], object]) -> None:
        self._alarms = alarms
        self.when = when
        self.fn: Callable[[], object] | None = fn
        """None once it ran or was cancelled."""

    @property
    def pending(self) -> bool:
        """It has neither run nor been cancelled."""
        return self.fn is not None

    def cancel(self) -> None:
        """It never runs (nothing if it ran already)."""
        if self.fn is not None:
            self.fn = None
            self._alarms._cancelled_one()


class Alarms:
    """The deadlines of a process's many waiters, served by `run()` (one task)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Alarm]] = []
        self._order = itertools.count()
        self._cancelled = 0
        self._sleep: trio.CancelScope | None = None

    def __len__(self) -> int:
        """Entries in the heap, the cancelled ones not yet dropped included (for tests)."""
        return len(self._heap)

    def call_at(self, when: float, fn: Callable[[], object]) -> Alarm:
        """Run `fn()` once `trio.current_time()` reaches `when` (rule 1)."""
        alarm = Alarm(self, when, fn)
        heapq.heappush(self._heap, (when, next(self._order), alarm))
        sleep = self._sleep
        if sleep is not None and when < sleep.deadline:
            sleep.deadline = when
        return alarm

    async def run(self) -> None:
        """Run the alarms as they come due, until cancelled."""
        try:
            while True:
                self._run_due(trio.current_time())
                with trio.CancelScope(deadline=self._next_deadline()) as self._sleep:
                    await trio.sleep_forever()
        finally:
            self._sleep = None

    def _run_due(self, now: float) -> None:
        heap = self._heap  # compacted in place, also by a function run here
        while heap and heap[0][0] <= now:
            alarm = heapq.heappop(heap)[2]
            fn = alarm.fn
            if fn is None:
                self._cancelled -= 1
                continue
            alarm.fn = None
            try:
                fn()
            except Exception:
                logger.exception("an alarm's function raised")

    def _next_deadline(self) -> float:
        heap = self._heap
        while heap:
            deadline, _, alarm = heap[0]
            if alarm.fn is not None:
                return deadline
            heapq.heappop(heap)
            self._cancelled -= 1
        return math.inf

    def _cancelled_one(self) -> None:
        self._cancelled += 1
        if self._cancelled > _COMPACT_AT and self._cancelled * 2 > len(self._heap):
            self._heap[:] = [entry for entry in self._heap if entry[2].fn is not None]
            heapq.heapify(self._heap)
            self._cancelled = 0
