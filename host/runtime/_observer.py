"""Observers of a cell and the output they take.

An observer is a pending `wait` (or the initial response of an `execute`). It ends at the first
of: its window elapsed, `yield_control()`, the cell's completion, its termination. Only one
observer watches a cell at a time.

Rules:
1. The observer's own task builds its response, with no checkpoint between taking the output
   and returning it: a cancelled observer never takes output, so no output is lost.
2. The cell marks a *boundary* (how many buffered items belong to this observation) when
   `yield_control()` runs or the window ends while the cell's events are being processed; an
   observation that yields returns only the output before its boundary. This is how a 0 ms
   window yields before output that was queued behind the cell's start (design.md, runtime 5.3).
3. The window of the initial observer starts when the cell has started (compile and globals set-up
   excluded); a `wait` window starts at once.
4. An observation may be given a byte budget (the host gives the frame limit): it takes only the
   items that fit and leaves the rest in the cell for the next observation; a response that
   leaves output behind is a `Yielded` (a `Pending` for a frontier observer), even if the cell
   has completed.
5. A frontier observer (`execute_to_pending`, `wait_to_pending`) has no window and no boundary:
   neither time, `yield_control()` nor `preempt` ends it; the cell's frontier, its completion
   or its termination does (design.md, runtime 5.9).
6. The observer's task sleeps without a deadline of its own: the end of its window is an alarm
   of the engine that wakes it (rule 9 of `_cell`; windows end only while the JavaScript runs).
   A cancel scope per sleep cost about as much as the rest of a trivial cell's observation.
7. An observation can be cancelled without trio (`cancel()`, the host's `operation/cancel` of an
   execute): its task raises `ObservationCancelledError` when it next wakes, before it takes
   anything, as a cancelled task would at its checkpoint. The host's request needs no cancel
   scope around the wait.
8. An observation's task may begin at its first wake (`on_wake`; the host's initial
   observations do): until something wakes it (an event of the cell that ends it, its
   window's end, a cancellation, a termination, the cell's close), a step of its task would
   only find nothing to answer and sleep. A waiting cell's host keeps no task for it. Woken by
   the cell's own events, the host takes the response without any task
   (`InitialObservation.take_now`, after the engine's batch).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import trio

from codemode import CellLimits, ContentItem, InputText, Pending, RuntimeResponse
from codemode.errors import CodeModeError, initial_response_taken

from ._phases import INITIAL, Initial, InitialTrigger

ITEM_OVERHEAD = 64
"""Bytes counted per item beside its text or URL: its framing in a msgpack response."""

DEFAULT_YIELD_TIME_MS = 10_000
YIELD_GRACE_MS = 1_000
"""Added to windows of 10 s or more (design.md, runtime 2.15)."""


def observation_window_ms(yield_time_ms: int, limits: CellLimits) -> int:
    """The effective window: the grace for long windows, then the session's clamp."""
    window = yield_time_ms
    if window >= DEFAULT_YIELD_TIME_MS:
        window += YIELD_GRACE_MS
    if limits.max_yield_time_ms is not None:
        window = min(window, limits.max_yield_time_ms)
    return window


class ObservationCancelledError(Exception):
    """The observation was cancelled (rule 7): it took no output."""


class Observer:
    """One observation of a cell.

    Attributes:
        window_ms: the observation window; None for a frontier observer (rule 5).
        deadline: trio time at which it yields; None until the window starts.
        boundary: set when it must yield with the first `boundary` buffered items.
    """

    __slots__ = ("boundary", "cancelled", "deadline", "on_wake", "wake", "window_ms")

    def __init__(self, window_ms: int | None, *, start_now: bool) -> None:
        self.window_ms = window_ms
        self.deadline: float | None = None
        self.boundary: int | None = None
        self.cancelled = False
        self.wake: trio.Event | None = None  # made by `sleep`: most observations never sleep
        self.on_wake: Callable[[], None] | None = None
        if start_now:
            self.start_window(trio.current_time())

    @property
    def frontier(self) -> bool:
        """Whether it observes to the pending frontier (it never yields)."""
        return self.window_ms is None

    def start_window(self, now: float) -> None:
        if self.deadline is None and self.window_ms is not None:
            self.deadline = now + self.window_ms / 1000

    async def sleep(self) -> None:
        """Until `notify()` (also at the end of the window, by the cell: rule 6)."""
        wake = self.wake = trio.Event()
        await wake.wait()

    def notify(self) -> None:
        """Wake the observation's task, or start it: `on_wake`, if set, is called once, at the
        first wake (rule 8)."""
        if self.wake is not None:
            self.wake.set()
        on_wake = self.on_wake
        if on_wake is not None:
            self.on_wake = None
            on_wake()

    def cancel(self) -> None:
        """End the observation without a response (rule 7)."""
        self.cancelled = True
        self.notify()

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline

    def mark_boundary(self, index: int) -> None:
        """Yield with the output buffered so far (the first mark wins)."""
        if self.boundary is None:
            self.boundary = index
        self.notify()


class InitialObservation:
    """The observation `execute` attaches, which belongs to its `StartedCell` (rule 5 of
    `_cell`): awaited once (`take`, then `done`), or given up unawaited (`release`)."""

    __slots__ = ("observer", "state")

    def __init__(self, window_ms: int | None) -> None:
        self.observer: Observer | None = Observer(window_ms, start_now=False)
        self.state = Initial.PENDING

    def take(self, cell_id: str) -> Observer:
        """The observer, for the one await of the initial response."""
        if self.state is not Initial.PENDING or self.observer is None:
            raise CodeModeError(initial_response_taken(cell_id))
        self.state = INITIAL.move(self.state, InitialTrigger.TAKE)
        return self.observer

    def start_when_woken(self, start: Callable[[], None]) -> None:
        """`start()` at the observation's first wake (rule 8), before anyone took it."""
        assert self.observer is not None
        assert self.state is Initial.PENDING
        self.observer.on_wake = start

    def take_now(
        self,
        answer: Callable[[Observer], RuntimeResponse | Pending | None],
        detach: Callable[[Observer], None],
    ) -> RuntimeResponse | Pending | None:
        """What `answer(observer)` gives now, which ends the observation as its await would
        (then `detach(observer)`); None: it must be awaited (a frontier observer always is).
        What `answer` raises ends it too."""
        observer = self.observer
        if observer is None or observer.frontier or self.state is not Initial.PENDING:
            return None
        try:
            response = answer(observer)
        except Exception:
            self.done()
            detach(observer)
            raise
        if response is not None:
            self.done()
            detach(observer)
        return response

    def done(self) -> None:
        self.state = INITIAL.move(self.state, InitialTrigger.ANSWER)
        self.observer = None

    def cancel(self) -> None:
        """It ends without a response: its await of `initial_response()` raises
        `ObservationCancelledError`, now or when awaited (rule 7)."""
        if self.observer is not None:
            self.observer.cancel()

    def release(self) -> Observer | None:
        """Given up unawaited: the observer to detach (None: it was taken or is done)."""
        if self.state is not Initial.PENDING:
            return None
        observer = self.observer
        self.state = INITIAL.move(self.state, InitialTrigger.RELEASE)
        self.observer = None
        return observer


class Preemption:
    """A request that one observation yield now, which may come before that observation has
    attached: the host's `operation/yield` can overtake the task that starts its wait."""

    __slots__ = ("_requested", "_target")

    def __init__(self) -> None:
        self._requested = False
        self._target: Callable[[], None] | None = None

    def request(self) -> None:
        if self._target is not None:
            self._target()
        else:
            self._requested = True

    def bind(self, target: Callable[[], None]) -> None:
        """The observation attached: `target` preempts it (now, if already requested)."""
        self._target = target
        if self._requested:
            target()


def item_bytes(item: ContentItem) -> int:
    """An upper bound of the bytes `item` takes in an encoded response."""
    text = item.text if isinstance(item, InputText) else item.image_url
    size = len(text) if text.isascii() else len(text.encode(errors="surrogatepass"))
    return size + ITEM_OVERHEAD


def fitting(items: Sequence[ContentItem], count: int, budget: int | None) -> int:
    """How many of the first `count` items fit in `budget` bytes (rule 4; all if no budget)."""
    if budget is None:
        return count
    used = 0
    for index in range(count):
        used += item_bytes(items[index])
        if used > budget:
            return index
    return count
