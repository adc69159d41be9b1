"""A session of the runtime: its cells, their stored values, their limits (design.md, runtime 5).

Rules:
1. Cell ids are decimal counters per session from "1", never reused.
2. A cell sees the stored values as of its start plus its own writes; its writes merge into
   the session at its natural completion, key by key (last committer wins).
3. Shutdown rejects new operations at once (execute, wait and terminate raise
   `SessionShuttingDownError`), terminates every cell (CPU-bound ones included: the engine
   interrupts them) and returns after every cell has closed; a shutdown cancelled half-way
   still closes every cell, and the next `shutdown()` waits for the rest.
4. Without stored values (`store_load=False`, reference StoreLoadMode) cells have no `store`
   or `load` globals and the session keeps nothing.
5. A new cell is admitted against the connection's (or provider's) `Admission`: it takes an
   active-cell slot, and the session must hold fewer completions nobody collected than
   `max_uncollected_results` (`AdmissionError` otherwise; nothing is dropped).
6. The session keeps its budgets (`_budget`): its cells count their tool calls and CPU time
   there, a new cell is admitted only while the CPU budget lasts, and `usage()` reports the
   counts.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable

import trio
from codemode_host.engine import CellTool, Engine

from codemode import (
    CellInfo,
    CellLimits,
    Completed,
    ExecuteRequest,
    LiveCell,
    Pending,
    RuntimeResponse,
    SessionDelegate,
    SessionUsage,
    StartedCell,
    Terminated,
    WaitOutcome,
    WaitRequest,
    Yielded,
    missing_cell,
    normalize_identifier,
)
from codemode._trio import CallWorkers
from codemode.errors import ObserverBusyError, RuntimeEndedError, SessionShuttingDownError
from codemode.observability import CellReport

from ._admission import Admission
from ._budget import SessionBudget
from ._cell import RuntimeCell
from ._observer import DEFAULT_YIELD_TIME_MS, Preemption, observation_window_ms
from ._phases import Lifecycle
from ._share import CellShare
from ._watch import CellWatch

SESSION_WORKERS = 16
"""Workers a session with workers of its own keeps parked for its delegate calls."""


class RuntimeSession:
    """A code-mode session run by the engine in this process (implements `codemode.Session`).

    Args:
        engine: the engine that runs the cells.
        nursery: where the tasks of cells that need one (rule 10 of `_cell`), the session's
            watch over the others and delegate calls (by `workers`) run; it must outlive the
            session, and cancelling it closes every cell.
        limits: the limits of every cell of the session.
        max_response_bytes: the most output one observation takes (the host gives its frame
            limit); output past it stays in the cell for the next observation.
        store_load: False for a session without stored values (rule 4).
        admission: the capacity the session shares with the others of its connection or
            provider (rule 5; default: a capacity of its own, with the default limits).
        workers: the tasks that run delegate calls, shared with the other sessions of the
            nursery's owner, who closes them (default: workers of its own, closed when the
            session has shut down).
        watch: the watch over cells without a task of their own (`_watch`), shared likewise
            and ended by the nursery's cancellation (default: a watch of its own, closed when
            the session has shut down).
        session_id: the session's name in the warning of a `StartedCell` dropped unreleased.
        stored_values: what the session starts with (a copy its client kept of an earlier
            host's session: docs/durability.md).
        on_commit: told each naturally completed cell's writes as they are committed (the
            host sends them to a client that keeps its stored values).
    """

    def __init__(
        self,
        engine: Engine,
        nursery: trio.Nursery,
        limits: CellLimits,
        *,
        max_response_bytes: int | None = None,
        store_load: bool = True,
        admission: Admission | None = None,
        workers: CallWorkers | None = None,
        watch: CellWatch | None = None,
        session_id: str = "session",
        stored_values: dict[str, bytes] | None = None,
        on_commit: Callable[[dict[str, bytes]], None] | None = None,
    ) -> None:
        self._engine = engine
        self._session_id = session_id
        self._nursery = nursery
        self._own_workers = workers is None
        self._workers = workers or CallWorkers(nursery, keep=SESSION_WORKERS)
        self._own_watch = watch is None
        self._watch = watch or CellWatch(nursery)
        self._admission = admission or Admission()
        self._store_load = store_load
        self._limits = limits
        # The limits every cell starts with, worked out once (they are frozen).
        self._heap_limit = limits.heap_size_bytes()
        self._output_limit = limits.pending_output_bytes()
        self._stored_value_limit = limits.stored_value_bytes()
        self._alive = True
        self._next_cell = 1
        self._cells: dict[str, RuntimeCell] = {}
        self._dropped: collections.deque[Callable[[], None]] = collections.deque()
        self._stored: dict[str, bytes] = dict(stored_values or {})
        self._share = CellShare(
            workers=self._workers,
            admission=self._admission,
            alarms=engine.alarms,
            # Not a bound method: the share would hold the session, a cycle for the collector.
            commit=functools.partial(_commit, self._stored, on_commit),
            cells=self._cells,
            watch=self._watch,
            max_response_bytes=max_response_bytes,
            budget=SessionBudget(limits),
            wall_time_ms=limits.max_wall_time_ms,
        )

    @property
    def is_alive(self) -> bool:
        """False once shutdown began."""
        return self._alive

    @property
    def limits(self) -> CellLimits:
        return self._limits

    async def execute(
        self,
        request: ExecuteRequest,
        delegate: SessionDelegate,
        *,
        observe_initial: bool = True,
        report_to: Callable[[CellReport], None] | None = None,
    ) -> StartedCell:
        """Admit and start a cell; its first response comes from `initial_response()`
        (`observe_initial=False`: the `StartedCell` is released at once, and the cell's next
        `wait` observes it from its start). `report_to` gets the cell's `CellReport` as it
        closes (rule 11 of `_cell`; the cell's telemetry).

        Raises:
            SessionShuttingDownError: shutdown has begun.
        """
        await trio.lowlevel.checkpoint()
        cell = self.start(request, delegate, report_to=report_to)

        async def initial_response() -> RuntimeResponse:
            response = await cell.initial_response()
            assert not isinstance(response, Pending), "only frontier observers get a Pending"
            return response

        return StartedCell._create(
            cell.cell_id,
            initial_response,
            cell.release_initial_observer,
            self._dropped,
            session_id=self._session_id,
            observe_initial=observe_initial,
        )

    async def execute_to_pending(
        self,
        request: ExecuteRequest,
        delegate: SessionDelegate,
        *,
        report_to: Callable[[CellReport], None] | None = None,
    ) -> Pending | Completed | Terminated:
        """Admit a cell and observe it to its pending frontier (or its end).

        Cancelled before it returns, it terminates the cell: its caller never learned its id.

        Raises:
            SessionShuttingDownError: shutdown has begun.
            FrameLimitError: the cell's next output item alone exceeds the response budget.
        """
        StartedCell._release_dropped(self._dropped)
        await trio.lowlevel.checkpoint()
        cell = self.start_to_pending(request, delegate, report_to=report_to)
        try:
            response = await cell.initial_response()
        except BaseException:
            cell.begin_shutdown(reason="terminated")  # its caller never learned its id
            raise
        await trio.lowlevel.cancel_shielded_checkpoint()  # the response is taken: no cancel
        assert not isinstance(response, Yielded), "a frontier observer never yields"
        return response

    def start(
        self,
        request: ExecuteRequest,
        delegate: SessionDelegate,
        *,
        report_to: Callable[[CellReport], None] | None = None,
    ) -> RuntimeCell:
        """Admit and start a cell whose initial observation the caller awaits itself
        (`initial_response()`, at once): `execute` without its checkpoint and without a
        `StartedCell`, for the host, whose request is a fresh task.

        Raises:
            SessionShuttingDownError: shutdown has begun.
        """
        StartedCell._release_dropped(self._dropped)  # keeps the deque short between waits
        return self._start(request, delegate, frontier=False, report_to=report_to)

    def start_to_pending(
        self,
        request: ExecuteRequest,
        delegate: SessionDelegate,
        *,
        report_to: Callable[[CellReport], None] | None = None,
    ) -> RuntimeCell:
        """Admit a cell whose initial observation runs to its pending frontier; the host awaits
        its `initial_response()` itself, and `abandon()`s it when its caller is gone.

        Raises:
            SessionShuttingDownError: shutdown has begun.
        """
        return self._start(request, delegate, frontier=True, report_to=report_to)

    def _start(
        self,
        request: ExecuteRequest,
        delegate: SessionDelegate,
        *,
        frontier: bool,
        report_to: Callable[[CellReport], None] | None,
    ) -> RuntimeCell:
        if not self._alive:
            raise SessionShuttingDownError()
        self._share.budget.admit_cell()
        self._admission.admit_cell(self._share.uncollected)
        try:
            engine_cell = self._engine.start_cell(
                request.source,
                tools=[
                    CellTool(name=normalize_identifier(tool.name), description=tool.description)
                    for tool in request.enabled_tools
                ],
                stored_values=self._stored,
                heap_limit=self._heap_limit,
                store_load=self._store_load,
                cpu_limit_ms=self._limits.max_cpu_time_ms,
                output_limit=self._output_limit,
                stored_value_limit=self._stored_value_limit,
            )
        except BaseException:
            self._admission.release_cell()
            raise
        cell_id = str(self._next_cell)
        self._next_cell += 1
        yield_time_ms = request.yield_time_ms
        if yield_time_ms is None:
            yield_time_ms = DEFAULT_YIELD_TIME_MS
        cell = RuntimeCell(
            cell_id=cell_id,
            request=request,
            delegate=delegate,
            engine_cell=engine_cell,
            initial_window_ms=(
                None if frontier else observation_window_ms(yield_time_ms, self._limits)
            ),
            share=self._share,
            report_to=report_to,
        )
        self._cells[cell_id] = cell
        self._watch.add(cell)
        cell.start(self._nursery.start_soon)
        return cell

    async def wait(
        self, request: WaitRequest, *, preemption: Preemption | None = None
    ) -> WaitOutcome:
        """Observe a cell for up to `request.yield_time_ms` (grace and clamp applied); a cell
        paused at its pending frontier resumes.

        The observer is attached before the first checkpoint, so a wait made before an event
        reaches the cell (a tool's result, a timer) observes that event: a `yield_control()`
        it leads to is not lost for want of an observer (design.md, runtime 5.3: the actor takes
        commands before runtime events).

        Raises:
            ObserverBusyError: another observation of the cell is in progress.
            SessionShuttingDownError: shutdown has begun.
        """
        window = observation_window_ms(request.yield_time_ms, self._limits)
        return await self._observe(request.cell_id, window, preemption)

    async def wait_to_pending(self, cell_id: str) -> WaitOutcome:
        """Resume a cell and observe it to its next pending frontier, its completion or its
        termination (a frontier it reached unobserved is returned at once).

        Raises:
            ObserverBusyError: another observation of the cell is in progress.
            SessionShuttingDownError: shutdown has begun.
        """
        return await self._observe(cell_id, None)

    async def _observe(
        self, cell_id: str, window_ms: int | None, preemption: Preemption | None = None
    ) -> WaitOutcome:
        StartedCell._release_dropped(self._dropped)
        cell = self._cells.get(cell_id)
        if (
            not self._alive
            or cell is None
            or cell.lifecycle in (Lifecycle.TERMINATING, Lifecycle.TERMINATED)
        ):
            await trio.lowlevel.checkpoint()
            if not self._alive:
                raise SessionShuttingDownError()
            return missing_cell(cell_id)
        try:
            observer = cell.attach(window_ms)
        except ObserverBusyError:
            await trio.lowlevel.checkpoint()
            raise
        if preemption is not None:
            preemption.bind(lambda: cell.preempt(observer))
        try:
            response = await cell.observe(observer)
        except RuntimeEndedError:
            return missing_cell(cell_id)
        await trio.lowlevel.cancel_shielded_checkpoint()  # the response is taken: no cancel
        return LiveCell(response=response)

    async def preempt(self, cell_id: str) -> None:
        """Make the cell's active observation yield now; no effect on frontier observers, on
        an unobserved cell or on an unknown one.

        Raises:
            SessionShuttingDownError: shutdown has begun.
        """
        await trio.lowlevel.checkpoint()
        if not self._alive:
            raise SessionShuttingDownError()
        self.request_preempt(cell_id)

    def request_preempt(self, cell_id: str) -> None:
        """`preempt` without a checkpoint (the host's `operation/yield`)."""
        cell = self._cells.get(cell_id)
        if cell is not None:
            cell.preempt()

    async def terminate(self, cell_id: str) -> WaitOutcome:
        """Stop a cell; returns its undelivered output, or its buffered completion.

        Raises:
            AlreadyTerminatingError: a termination of that cell is in progress.
            SessionShuttingDownError: shutdown has begun.
        """
        # The termination takes effect before the first pass of the scheduler: a completion
        # the engine reports meanwhile does not overtake it (design.md, runtime 5.3, the actor
        # takes commands before runtime events).
        await trio.lowlevel.checkpoint_if_cancelled()
        cell = self._cells.get(cell_id) if self._alive else None
        if cell is None:
            await trio.lowlevel.checkpoint()
            if not self._alive:
                raise SessionShuttingDownError()
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
        if self._own_workers:
            self._workers.close()
        if self._own_watch:
            self._watch.close()

    async def cells(self) -> list[CellInfo]:
        """The live cells (admitted, not yet closed), oldest first: what holds capacity.

        Raises:
            SessionShuttingDownError: shutdown has begun.
        """
        await trio.lowlevel.checkpoint()
        if not self._alive:
            raise SessionShuttingDownError()
        return self.inventory()

    async def usage(self) -> SessionUsage:
        """What the session's cells used of its budgets (rule 6).

        Raises:
            SessionShuttingDownError: shutdown has begun.
        """
        await trio.lowlevel.checkpoint()
        if not self._alive:
            raise SessionShuttingDownError()
        return self._share.budget.usage()

    def inventory(self) -> list[CellInfo]:
        """`cells()` without a checkpoint, also while shutting down (the host's log)."""
        now = trio.current_time()
        return [cell.info(now) for cell in self._cells.values()]

    def approval_waiting(self, cell_id: str, call_id: str, waiting: bool) -> None:
        """Tool call `call_id` of live cell `cell_id` started or stopped waiting for approval
        (nothing if the cell is gone)."""
        cell = self._cells.get(cell_id)
        if cell is not None:
            cell.approval_waiting(call_id, waiting)

    def cell(self, cell_id: str) -> RuntimeCell | None:
        """The live cell `cell_id` (for the host's inventory and for tests)."""
        return self._cells.get(cell_id)


def _commit(
    stored: dict[str, bytes],
    on_commit: Callable[[dict[str, bytes]], None] | None,
    writes: dict[str, bytes],
) -> None:
    """Merge a naturally completed cell's writes into the session's values (rule 2), and tell
    `on_commit` (a client that keeps its stored values)."""
    stored.update(writes)
    if on_commit is not None and writes:
        on_commit(dict(writes))
