"""The in-process provider: sessions served by the runtime inside the caller's trio loop.

The same API as the process provider, without a host process: the engine's worker threads
run the JavaScript, and cells, tool calls and notifications are tasks of the provider's
nursery. Documented differences (`docs/python-api.md`): `host_duration` is always None, and a
crash of the engine takes the application with it (the process provider isolates it).

Rules:
1. A session's shutdown runs as a task of the provider: cancelling the caller of `shutdown()`
   does not stop it, and every later `shutdown()` waits for the same end.
2. The provider forgets a session once it is shut down: nothing is retained per closed session.
3. After the provider's block, every operation raises `ProviderClosedError`.
4. Admission (`AdmissionLimits`) is the provider's: its sessions share the active-cell and
   pending-call slots, as a host connection's do; requests in flight are a wire notion only.
5. Delegate calls run in a detached nursery (`open_detached_nursery`) and sync tools in the
   provider's own threads (`ToolThreads`): leaving the block waits at most `CLEANUP_GRACE` for
   calls that ignore cancellation, and abandons them (logged).
6. A session keeps the idempotency keys of its requests in this process (`_idempotency`), as
   every provider's session does.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial

import trio
from codemode_host.engine import Engine, open_engine
from codemode_host.runtime import Admission, CellWatch, RuntimeSession, worker_ceiling

from ._api import (
    AdmissionLimits,
    CellInfo,
    CellLimits,
    Completed,
    ExecuteRequest,
    Pending,
    RuntimeResponse,
    SessionDelegate,
    SessionUsage,
    StartedCell,
    Terminated,
    ToolThreadLimits,
    ToolThreadStatistics,
    WaitOutcome,
    WaitRequest,
)
from ._checks import check_cell_id, check_execute, check_idempotency_key, check_wait
from ._closing import close_provider
from ._idempotency import IdempotencyBook, request_fingerprint
from ._providers import ProviderStatistics
from ._tool_threads import ToolThreads, use_tool_threads
from ._trio import (
    CLEANUP_GRACE,
    CallWorkers,
    RunOnce,
    open_detached_nursery,
    open_service_nursery,
)
from .errors import ProviderClosedError, SessionShuttingDownError, check_platform
from .observability import SessionTraces

SHUTDOWN_TIMEOUT = 5.0
"""Seconds the provider's exit waits for its sessions to shut down before cancelling them."""

PROVIDER_WORKERS = 64
"""Worker tasks the provider keeps parked for its cells' delegate calls."""

logger = logging.getLogger("codemode.inprocess")


class InProcessSession:
    """A session whose cells run in this process (implements `codemode.Session`).

    Made by `InProcessProvider.create_session`.
    """

    def __init__(
        self, provider: InProcessProvider, runtime: RuntimeSession, session_id: str
    ) -> None:
        self._provider = provider
        self._runtime = runtime
        self._session_id = session_id
        self._shutdown = RunOnce()
        self._traces = SessionTraces("in_process", local_runtime=True)
        self._keys = IdempotencyBook()  # rule 6

    @property
    def is_alive(self) -> bool:
        """False once shutdown began (or the provider closed)."""
        return self._runtime.is_alive and not self._provider.closed

    def _check(self) -> None:
        if self._provider.closed:
            raise ProviderClosedError()
        if self._shutdown.started:
            raise SessionShuttingDownError()

    async def execute(
        self,
        request: ExecuteRequest,
        delegate: SessionDelegate,
        *,
        observe_initial: bool = True,
        idempotency_key: str | None = None,
    ) -> StartedCell:
        """Admit a cell and start it; returns before its first response (`observe_initial=False`:
        the `StartedCell` is released already, and the cell's next `wait` observes it).
        `idempotency_key`: a repeat returns a `StartedCell` of the same cell (rule 6).

        Raises:
            SessionShuttingDownError: shutdown has begun.
            ProviderClosedError: the provider was closed.
            InvalidRequestError: the key was used for another request.
        """
        self._check()
        check_execute(request)
        check_idempotency_key(idempotency_key)
        if idempotency_key is None:
            return await self._execute(request, delegate, observe_initial)
        return await self._keys.execute(
            idempotency_key,
            request,
            partial(self._execute, request, delegate, True),
            self.wait,
            observe_initial=observe_initial,
        )

    async def _execute(
        self, request: ExecuteRequest, delegate: SessionDelegate, observe_initial: bool
    ) -> StartedCell:
        traced = self._traces.begin(request, delegate, self._session_id)
        if traced is None:
            started = await self._runtime.execute(
                request, delegate, observe_initial=observe_initial
            )
        else:
            try:
                started = await self._runtime.execute(
                    request, traced, observe_initial=observe_initial, report_to=traced.cell_report
                )
            except BaseException as error:
                traced.refused(error)
                raise
            self._traces.started(traced, started.cell_id)
        # Rule 3 holds for its initial response too.
        started._initial_response = partial(
            self._initial_response, started._initial_response, started.cell_id
        )
        return started

    async def _initial_response(
        self, initial_response: Callable[[], Awaitable[RuntimeResponse]], cell_id: str
    ) -> RuntimeResponse:
        if self._provider.closed:
            raise ProviderClosedError()
        traced = self._traces.get(cell_id)
        if traced is None:
            return await initial_response()
        return await traced.observe("initial_response", lambda _: initial_response())

    async def wait(
        self, request: WaitRequest, *, idempotency_key: str | None = None
    ) -> WaitOutcome:
        """Observe a cell: new output, its completion, or its termination.

        Raises:
            ObserverBusyError: another observation of the cell is in progress.
            SessionShuttingDownError: shutdown has begun.
            ProviderClosedError: the provider was closed.
        """
        self._check()
        check_wait(request)
        check_idempotency_key(idempotency_key)
        fingerprint = ("wait", request.cell_id, request.yield_time_ms)
        return await self._keys.run(idempotency_key, fingerprint, partial(self._wait, request))

    async def _wait(self, request: WaitRequest) -> WaitOutcome:
        traced = self._traces.get(request.cell_id)
        if traced is None:
            return await self._runtime.wait(request)
        return await traced.observe("wait", lambda _: self._runtime.wait(request))

    async def terminate(self, cell_id: str, *, idempotency_key: str | None = None) -> WaitOutcome:
        """Stop a cell and return its undelivered output (or its buffered completion).

        Raises:
            AlreadyTerminatingError: a termination of that cell is in progress.
            SessionShuttingDownError: shutdown has begun.
            ProviderClosedError: the provider was closed.
        """
        self._check()
        check_cell_id(cell_id)
        check_idempotency_key(idempotency_key)
        fingerprint = ("terminate", cell_id)
        return await self._keys.run(idempotency_key, fingerprint, partial(self._terminate, cell_id))

    async def _terminate(self, cell_id: str) -> WaitOutcome:
        traced = self._traces.get(cell_id)
        if traced is None:
            return await self._runtime.terminate(cell_id)
        return await traced.observe("terminate", lambda _: self._runtime.terminate(cell_id))

    async def execute_to_pending(
        self,
        request: ExecuteRequest,
        delegate: SessionDelegate,
        *,
        idempotency_key: str | None = None,
    ) -> Pending | Completed | Terminated:
        """Admit a cell and run it to its pending frontier, or its end.

        Cancelled before it returns, it terminates the cell.

        Raises:
            SessionShuttingDownError: shutdown has begun.
            ProviderClosedError: the provider was closed.
        """
        self._check()
        check_execute(request)
        check_idempotency_key(idempotency_key)
        fingerprint = request_fingerprint("execute_to_pending", request)
        return await self._keys.run(
            idempotency_key, fingerprint, partial(self._execute_to_pending, request, delegate)
        )

    async def _execute_to_pending(
        self, request: ExecuteRequest, delegate: SessionDelegate
    ) -> Pending | Completed | Terminated:
        traced = self._traces.begin(request, delegate, self._session_id)
        if traced is None:
            return await self._runtime.execute_to_pending(request, delegate)
        try:
            response = await traced.observe(
                "execute_to_pending",
                lambda _: self._runtime.execute_to_pending(
                    request, traced, report_to=traced.cell_report
                ),
            )
        except BaseException as error:
            if not traced.cell_id:
                traced.refused(error)
            raise
        self._traces.started(traced, response.cell_id)
        return response

    async def wait_to_pending(
        self, cell_id: str, *, idempotency_key: str | None = None
    ) -> WaitOutcome:
        """Resume a cell and observe it to its next pending frontier, or its end.

        Raises:
            ObserverBusyError: another observation of the cell is in progress.
            SessionShuttingDownError: shutdown has begun.
            ProviderClosedError: the provider was closed.
        """
        self._check()
        check_cell_id(cell_id)
        check_idempotency_key(idempotency_key)
        fingerprint = ("wait_to_pending", cell_id)
        return await self._keys.run(
            idempotency_key, fingerprint, partial(self._wait_to_pending, cell_id)
        )

    async def _wait_to_pending(self, cell_id: str) -> WaitOutcome:
        traced = self._traces.get(cell_id)
        if traced is None:
            return await self._runtime.wait_to_pending(cell_id)
        return await traced.observe(
            "wait_to_pending", lambda _: self._runtime.wait_to_pending(cell_id)
        )

    async def preempt(self, cell_id: str) -> None:
        """Make the cell's active observation return `Yielded` now.

        Raises:
            SessionShuttingDownError: shutdown has begun.
            ProviderClosedError: the provider was closed.
        """
        self._check()
        check_cell_id(cell_id)
        await self._runtime.preempt(cell_id)

    async def cells(self) -> list[CellInfo]:
        """The session's live cells, oldest first: what holds capacity.

        Raises:
            SessionShuttingDownError: shutdown has begun.
            ProviderClosedError: the provider was closed.
        """
        self._check()
        return await self._runtime.cells()

    async def usage(self) -> SessionUsage:
        """What the session's cells used of its budgets: tool calls and CPU time.

        Raises:
            SessionShuttingDownError: shutdown has begun.
            ProviderClosedError: the provider was closed.
        """
        self._check()
        return await self._runtime.usage()

    async def shutdown(self) -> None:
        """Terminate every cell and return once each has closed (rule 1)."""
        await self._shutdown.run(self._provider._nursery, self._shut_down)

    async def _shut_down(self) -> None:
        try:
            await self._runtime.shutdown()
        finally:
            self._provider._forget(self)

    def _cell_count(self) -> int:
        """Its cells admitted and not yet closed (the provider's `statistics()`)."""
        return len(self._runtime.inventory())


class InProcessProvider:
    """Creates sessions that run in this process. Made by `open_in_process_provider()`."""

    def __init__(
        self,
        engine: Engine,
        nursery: trio.Nursery,
        admission: Admission,
        calls: trio.Nursery,
        tool_threads: ToolThreads,
    ) -> None:
        self._engine = engine
        self._nursery = nursery
        self._workers = CallWorkers(calls, keep=PROVIDER_WORKERS)  # rule 5
        self._tool_threads = tool_threads
        use_tool_threads(self._workers.context, tool_threads)
        self._watch = CellWatch(nursery)  # ends when the provider's nursery is cancelled
        self._admission = admission
        self._sessions: set[InProcessSession] = set()
        self._session_ids = itertools.count(1)
        self.closed = False

    async def create_session(
        self,
        limits: CellLimits | None = None,
        *,
        store_load: bool = True,
        keep_stored_values: bool = False,
    ) -> InProcessSession:
        """A new session with its own cells, stored values and limits (`store_load=False`:
        cells have no `store` / `load`, and nothing is retained). `keep_stored_values` is
        accepted for the `Provider` protocol and changes nothing here: the runtime lives as
        long as the provider, so there is no host to lose (docs/durability.md).

        Raises:
            InvalidRequestError: invalid limits.
            ProviderClosedError: the provider is closed.
        """
        await trio.lowlevel.checkpoint()
        if self.closed:
            raise ProviderClosedError()
        limits = (limits or CellLimits()).checked()
        session_id = f"session-{next(self._session_ids)}"  # as the process provider's
        runtime = RuntimeSession(
            self._engine,
            self._nursery,
            limits,
            store_load=store_load,
            admission=self._admission,
            workers=self._workers,
            watch=self._watch,
            session_id=session_id,
        )
        session = InProcessSession(self, runtime, session_id)
        self._sessions.add(session)
        return session

    def statistics(self) -> ProviderStatistics:
        """Its sessions, their cells and its tool threads (no hosts: the cells run here)."""
        return ProviderStatistics(
            hosts=(),
            spawned=0,
            retired=0,
            sessions=len(self._sessions),
            cells=sum(session._cell_count() for session in self._sessions),
            tool_threads=self._tool_threads.statistics(),
        )

    def tool_thread_statistics(self) -> ToolThreadStatistics:
        """What the threads of the sessions' sync tools hold now (`docs/limits.md`)."""
        return self._tool_threads.statistics()

    def _forget(self, session: InProcessSession) -> None:
        self._sessions.discard(session)

    async def _close(self) -> None:
        """Shut every session down, for at most SHUTDOWN_TIMEOUT (`_closing.py`)."""
        self.closed = True
        await close_provider(
            self._sessions,
            shutdown_timeout=SHUTDOWN_TIMEOUT,
            bound=SHUTDOWN_TIMEOUT,
            logger=logger,
        )


@asynccontextmanager
async def open_in_process_provider(
    *, admission: AdmissionLimits | None = None, tool_threads: ToolThreadLimits | None = None
) -> AsyncIterator[InProcessProvider]:
    """A provider whose sessions run in the caller's trio loop, for the block's duration.

    Args:
        admission: the capacity its sessions share (rule 4; default `AdmissionLimits()`).
            The engine may grow to at least `max_active_cells` workers.
        tool_threads: the threads its sessions' sync tools run in (default
            `ToolThreadLimits()`; `docs/limits.md`).

    Resource handling: on exit every session is shut down (its cells terminated, each
    `cell_closed` called; shielded, at most SHUTDOWN_TIMEOUT), then delegate calls still
    running are cancelled and waited for at most CLEANUP_GRACE (those that ignore
    cancellation are abandoned and logged, rule 5), and the engine's threads are joined.

    Error handling: an exception raised in the block leaves it as itself (never wrapped in an
    `ExceptionGroup`). On a system other than Linux, entering the block raises
    `UnsupportedPlatformError`.
    """
    check_platform()
    limits = admission or AdmissionLimits()
    threads = ToolThreads(tool_threads)
    async with (
        open_engine(max_workers=worker_ceiling(limits)) as engine,
        open_detached_nursery(bound=CLEANUP_GRACE) as calls,
        open_service_nursery() as nursery,
    ):
        provider = InProcessProvider(engine, nursery, Admission(limits), calls, threads)
        try:
            yield provider
        finally:
            await provider._close()
            nursery.cancel_scope.cancel()
