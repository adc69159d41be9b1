"""The asyncio faces of a provider, a session and a started cell, over their trio objects.

Rules:
1. Every operation is the trio object's, run through the bridge (`_bridge` rule 2): the same
   results, the same errors, the same limits. Cancelling the asyncio task that awaits one cancels
   the trio operation and waits until it ended.
2. An operation whose result its cancelled caller never saw releases what it held, as a trio
   caller's cancellation would: a cell started by `execute` or `execute_to_pending` is
   terminated (its caller never had its id), a session made by `create_session` is shut down, and
   an observation's response (`initial_response`, `wait`, `wait_to_pending`) is kept for the
   cell's next observation through this session (`_Parked`), so no output is lost.
3. The application's delegate is an asyncio object: its `invoke_tool` and `notify` run as
   asyncio tasks on the loop (`AsyncioDelegate`), cancelled the asyncio way when the cell ends
   first; `cell_closed` is called as it is (it must not block). Sync tools of a `Toolbox` still
   run in the provider's own threads.
4. An `idempotency_key` goes to the trio session, whose book answers a repeat. Rule 2 is kept
   as it is: a keyed observation whose cancelled caller never saw its response parks it too
   (the key's repeat meets that response, parked or from the book), and a response parked
   earlier answers the next observation, keyed or not, without reaching the book.
"""

from __future__ import annotations

import functools
from asyncio import Future
from functools import partial
from typing import Any

import msgspec
import sniffio
import trio

from .. import (
    CellId,
    CellInfo,
    CellLimits,
    CodeModeError,
    Completed,
    ExecuteRequest,
    JsonValue,
    LiveCell,
    NestedToolCall,
    Pending,
    RuntimeResponse,
    SessionDelegate,
    SessionUsage,
    Terminated,
    ToolName,
    WaitOutcome,
    WaitRequest,
    Yielded,
)
from .. import Session as TrioSession
from .. import StartedCell as TrioStartedCell
from ._bridge import Bridge

ABANDON_TIMEOUT = 5.0
"""Seconds the termination of a cell whose caller was cancelled may take (as `CodeMode`'s)."""


class AsyncioDelegate:
    """The trio-facing delegate that runs an asyncio delegate's calls on the loop (rule 3)."""

    def __init__(self, delegate: SessionDelegate, bridge: Bridge) -> None:
        self.delegate = delegate
        self._bridge = bridge

    async def invoke_tool(self, call: NestedToolCall) -> JsonValue:
        return await self._bridge.run_asyncio(self.delegate.invoke_tool, call)

    async def notify(self, call_id: str, cell_id: CellId, text: str) -> None:
        await self._bridge.run_asyncio(self.delegate.notify, call_id, cell_id, text)

    def cell_closed(self, cell_id: CellId) -> None:
        self.delegate.cell_closed(cell_id)

    def needs_approval(self, tool: ToolName) -> bool:
        """The asyncio delegate's approval marks (a `Toolbox`'s `needs_approval=True`), so the
        default policy asks for those tools here too (docs/governance.md)."""
        marks = getattr(self.delegate, "needs_approval", None)
        return bool(marks(tool)) if callable(marks) else False


async def terminate_quietly(session: TrioSession, cell_id: CellId) -> None:
    """Terminate a cell nobody knows of any more (rule 2), bounded, ignoring that it is gone."""
    with trio.move_on_after(ABANDON_TIMEOUT):
        try:
            await session.terminate(cell_id)
        except CodeModeError:
            pass  # the cell or its host is gone already


class _Parked:
    """Responses that cancelled observers never saw, per cell, for the next observation."""

    def __init__(self) -> None:
        self._responses: dict[CellId, RuntimeResponse | Pending] = {}

    def park(self, response: RuntimeResponse | Pending) -> None:
        earlier = self._responses.get(response.cell_id)
        if earlier is not None:  # two cancelled observations in a row: keep both outputs
            items = [*earlier.content_items, *response.content_items]
            response = msgspec.structs.replace(response, content_items=items)
        self._responses[response.cell_id] = response

    def take(self, cell_id: CellId) -> RuntimeResponse | Pending | None:
        return self._responses.pop(cell_id, None)


def _as_observation(response: RuntimeResponse | Pending) -> RuntimeResponse:
    """A parked response as a plain `wait` returns it (a frontier is output so far)."""
    if isinstance(response, Pending):
        return Yielded(cell_id=response.cell_id, content_items=response.content_items)
    return response


def _prepend(
    parked: RuntimeResponse | Pending, response: RuntimeResponse | Pending
) -> RuntimeResponse | Pending:
    items = [*parked.content_items, *response.content_items]
    return msgspec.structs.replace(response, content_items=items)


def _in_trio() -> bool:
    try:
        return sniffio.current_async_library() == "trio"
    except sniffio.AsyncLibraryNotFoundError:
        return False


class StartedCell:
    """A cell that was admitted, as `Session.execute` returns it: `cell_id` now, its first
    response later (`initial_response()`, once), or given up with `release()` (or leaving
    `async with`) without ending the cell."""

    def __init__(self, started: TrioStartedCell, session: Session) -> None:
        self.cell_id: CellId = started.cell_id
        self._started = started
        self._session = session

    async def initial_response(self) -> RuntimeResponse:
        """The first observation: Yielded, Completed or Terminated (as the trio `StartedCell`).

        Cancelled, it loses nothing: the next `wait` of the cell has the output."""
        return await self._session._bridge.call(
            self._started.initial_response, orphan=self._session._park
        )

    def release(self) -> None:
        """Give the initial observation up without ending the cell (idempotent).

        Takes effect before any operation of the session asked for after it."""
        if _in_trio():
            self._started.release()  # a trio callback (a finalizer's): release now
        else:
            self._session._bridge.soon(self._started.release)  # before what is asked next

    async def __aenter__(self) -> StartedCell:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"StartedCell(cell_id={self.cell_id!r})"


class Session:
    """A code-mode session for an asyncio application: the methods of `codemode.Session`, as
    asyncio coroutines, with an asyncio delegate (rules 1-3)."""

    def __init__(self, session: TrioSession, bridge: Bridge) -> None:
        self.trio_session = session
        """The trio session behind this one (for `codemode.aio.CodeMode`)."""
        self._bridge = bridge
        self._parked = _Parked()

    @property
    def is_alive(self) -> bool:
        """False once shutdown began (or the host connection was lost)."""
        return self.trio_session.is_alive

    def _park(self, response: RuntimeResponse | Pending) -> None:
        self._parked.park(response)

    def _terminate(self, cell_id: CellId) -> Future[None]:
        return self._bridge.submit(terminate_quietly, self.trio_session, cell_id)

    async def execute(
        self,
        request: ExecuteRequest,
        delegate: SessionDelegate,
        *,
        observe_initial: bool = True,
        idempotency_key: str | None = None,
    ) -> StartedCell:
        """Admit a cell and start it; returns before its first response. Cancelled before it
        returns, it terminates the cell. `observe_initial=False`: the cell is released already
        (as on trio), its next `wait` observes it from its start. `idempotency_key`: as on
        trio (rule 4)."""

        def orphan(started: TrioStartedCell) -> Future[None]:
            started.release()
            return self._terminate(started.cell_id)

        started = await self._bridge.call(
            partial(
                self.trio_session.execute,
                observe_initial=observe_initial,
                idempotency_key=idempotency_key,
            ),
            request,
            AsyncioDelegate(delegate, self._bridge),
            orphan=orphan,
        )
        return StartedCell(started, self)

    async def wait(
        self, request: WaitRequest, *, idempotency_key: str | None = None
    ) -> WaitOutcome:
        """Observe a cell: new output, its completion, or its termination."""
        parked = self._parked.take(request.cell_id)
        if parked is not None:
            return LiveCell(response=_as_observation(parked))
        return await self._bridge.call(
            partial(self.trio_session.wait, idempotency_key=idempotency_key),
            request,
            orphan=self._park_outcome,
        )

    async def terminate(
        self, cell_id: CellId, *, idempotency_key: str | None = None
    ) -> WaitOutcome:
        """Stop a cell and return its undelivered output (or its buffered completion). The
        trio operation always completes; a cancelled caller is told after it did."""
        parked = self._parked.take(cell_id)
        if isinstance(parked, Completed | Terminated):
            return LiveCell(response=parked)  # the cell has closed: this is its buffered end
        outcome = await self._bridge.call(
            partial(self.trio_session.terminate, idempotency_key=idempotency_key), cell_id
        )
        if parked is not None and isinstance(outcome, LiveCell):
            response = _prepend(parked, outcome.response)
            assert not isinstance(response, Pending)
            return LiveCell(response=response)
        return outcome

    async def shutdown(self) -> None:
        """Terminate every cell and return once each has closed."""
        await self._bridge.call(self.trio_session.shutdown)

    async def execute_to_pending(
        self,
        request: ExecuteRequest,
        delegate: SessionDelegate,
        *,
        idempotency_key: str | None = None,
    ) -> Pending | Completed | Terminated:
        """Admit a cell and run it to its pending frontier (or its end). Cancelled before it
        returns, it terminates the cell."""

        def orphan(response: Pending | Completed | Terminated) -> Future[None] | None:
            if isinstance(response, Pending):
                return self._terminate(response.cell_id)
            return None

        return await self._bridge.call(
            partial(self.trio_session.execute_to_pending, idempotency_key=idempotency_key),
            request,
            AsyncioDelegate(delegate, self._bridge),
            orphan=orphan,
        )

    async def wait_to_pending(
        self, cell_id: CellId, *, idempotency_key: str | None = None
    ) -> WaitOutcome:
        """Resume a cell and observe it to its next frontier."""
        parked = self._parked.take(cell_id)
        if parked is not None:
            return LiveCell(response=parked)
        return await self._bridge.call(
            partial(self.trio_session.wait_to_pending, idempotency_key=idempotency_key),
            cell_id,
            orphan=self._park_outcome,
        )

    async def preempt(self, cell_id: CellId) -> None:
        """Make the cell's active observation return `Yielded` now."""
        await self._bridge.call(self.trio_session.preempt, cell_id)

    async def cells(self) -> list[CellInfo]:
        """The session's live cells (admitted and not yet closed), oldest first."""
        return await self._bridge.call(self.trio_session.cells)

    async def usage(self) -> SessionUsage:
        """What the session's cells used of its budgets: tool calls and CPU time."""
        return await self._bridge.call(self.trio_session.usage)

    def _park_outcome(self, outcome: WaitOutcome) -> None:
        if isinstance(outcome, LiveCell):
            self._park(outcome.response)


class Provider:
    """A provider for an asyncio application: `create_session` gives `codemode.aio.Session`s."""

    def __init__(self, provider: Any, bridge: Bridge) -> None:
        self.trio_provider = provider
        """The trio provider behind this one (its `statistics()`, where it has one)."""
        self._bridge = bridge

    async def create_session(
        self,
        limits: CellLimits | None = None,
        *,
        store_load: bool = True,
        keep_stored_values: bool = False,
    ) -> Session:
        """A new session (as the trio provider's `create_session`). Cancelled once the session
        was made, it shuts that session down."""

        def orphan(session: TrioSession) -> Future[None]:
            return self._bridge.submit(session.shutdown)

        session = await self._bridge.call(
            functools.partial(
                self.trio_provider.create_session,
                limits,
                store_load=store_load,
                keep_stored_values=keep_stored_values,
            ),
            orphan=orphan,
        )
        return Session(session, self._bridge)
