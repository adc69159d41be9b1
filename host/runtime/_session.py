"""A session of the runtime: its cells, their stored values, their limits (reference-runtime 5).

Rules:
1. Cell ids are decimal counters per session from "1", never reused.
2. A cell sees the stored values as of its start plus its own writes; its writes merge into
   the session at its natural completion, key by key (last committer wins).
3. Shutdown rejects new operations at once (execute, wait and terminate raise
   `SessionShuttingDownError`), terminates every cell (CPU-bound ones included: the engine
   interrupts them) and returns after every cell has closed; a shutdown cancelled half-way
   still closes every cell, and the next `shutdown()` waits for the rest.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import trio
from codemode_host.engine import CellTool, Engine

from codemode import (
    CellLimits,
    ExecuteRequest,
    LiveCell,
    SessionDelegate,
    StartedCell,
    WaitOutcome,
    WaitRequest,
    missing_cell,
    normalize_identifier,
)
from codemode.errors import ObserverBusyError, RuntimeEndedError, SessionShuttingDownError

from ._cell import RuntimeCell
from ._observer import DEFAULT_YIELD_TIME_MS, observation_window_ms
from ._phases import Lifecycle


class RuntimeSession:
    """A code-mode session run by the engine in this process (implements `codemode.Session`).

    Args:
        engine: the engine that runs the cells.
        nursery: where cell tasks and delegate calls run; it must outlive the session.
        limits: the limits of every cell of the session.
        max_response_bytes: the most output one observation takes (the host gives its frame
            limit); output past it stays in the cell for the next observation.
    """

    def __init__(
        self,
        engine: Engine,
        nursery: trio.Nursery,
        limits: CellLimits,
        *,
        max_response_bytes: int | None = None,
    ) -> None:
        self._engine = engine
        self._nursery = nursery
        self._limits = limits
        self._max_response_bytes = max_response_bytes
        self._alive = True
        self._next_cell = 1
        self._cells: dict[str, RuntimeCell] = {}
        self._dropped: collections.deque[Callable[[], None]] = collections.deque()
        self._stored: dict[str, bytes] = {}

    @property
    def is_alive(self) -> bool:
        """False once shutdown began."""
        return self._alive

    @property
    def limits(self) -> CellLimits:
        return self._limits

    async def execute(self, request: ExecuteRequest, delegate: SessionDelegate) -> StartedCell:
        """Admit and start a cell; its first response comes from `initial_response()`.

        Raises:
            SessionShuttingDownError: shutdown has begun.
        """
        StartedCell._release_dropped(self._dropped)  # keeps the deque short between waits
        await trio.lowlevel.checkpoint()
        if not self._alive:
            raise SessionShuttingDownError()
        cell_id = str(self._next_cell)
        self._next_cell += 1
        engine_cell = self._engine.start_cell(
            request.source,
            tools=[
                CellTool(name=normalize_identifier(tool.name), description=tool.description)
                for tool in request.enabled_tools
            ],
            stored_values=self._stored,
            heap_limit=self._limits.max_heap_size_bytes,
        )
        yield_time_ms = request.yield_time_ms
        if yield_time_ms is None:
            yield_time_ms = DEFAULT_YIELD_TIME_MS
        cell = RuntimeCell(
            cell_id=cell_id,
            request=request,
            delegate=delegate,
            engine_cell=engine_cell,
            nursery=self._nursery,
            commit=self._stored.update,
            forget=self._forget,
            initial_window_ms=observation_window_ms(yield_time_ms, self._limits),
            max_response_bytes=self._max_response_bytes,
        )
        self._cells[cell_id] = cell
        self._nursery.start_soon(cell.run)
        return StartedCell._create(
            cell_id, cell.initial_response, cell.release_initial_observer, self._dropped
        )

    async def wait(self, request: WaitRequest) -> WaitOutcome:
        """Observe a cell for up to `request.yield_time_ms` (grace and clamp applied).

        The observer is attached before the first checkpoint, so a wait made before an event
        reaches the cell (a tool's result, a timer) observes that event: a `yield_control()`
        it leads to is not lost for want of an observer (reference-runtime 5.3: the actor takes
        commands before runtime events).

        Raises:
            ObserverBusyError: another observation of the cell is in progress.
            SessionShuttingDownError: shutdown has begun.
        """
        StartedCell._release_dropped(self._dropped)
        cell = self._cells.get(request.cell_id)
        if (
            not self._alive
            or cell is None
            or cell.lifecycle in (Lifecycle.TERMINATING, Lifecycle.TERMINATED)
        ):
            await trio.lowlevel.checkpoint()
            if not self._alive:
                raise SessionShuttingDownError()
            return missing_cell(request.cell_id)
        try:
            observer = cell.attach(observation_window_ms(request.yield_time_ms, self._limits))
        except ObserverBusyError:
            await trio.lowlevel.checkpoint()
            raise
        try:
            response = await cell.observe(observer)
        except RuntimeEndedError:
            return missing_cell(request.cell_id)
        await trio.lowlevel.cancel_shielded_checkpoint()  # the response is taken: no cancel
        return LiveCell(response=response)

    async def terminate(self, cell_id: str) -> WaitOutcome:
        """Stop a cell; returns its undelivered output, or its buffered completion.

        Raises:
            AlreadyTerminatingError: a termination of that cell is in progress.
            SessionShuttingDownError: shutdown has begun.
        """
        await trio.lowlevel.checkpoint()
        if not self._alive:
            raise SessionShuttingDownError()
        cell = self._cells.get(cell_id)
        if cell is None:
            return missing_cell(cell_id)
        return await cell.terminate()

    async def shutdown(self) -> None:
        """Reject new cells, terminate every cell, and return once all have closed."""
        self._alive = False
        cells = list(self._cells.values())
        for cell in cells:
            cell.begin_shutdown()
        for cell in cells:
            await cell.closed.wait()

    def _forget(self, cell_id: str) -> None:
        self._cells.pop(cell_id, None)
