"""The operations a session makes on its host link (`HostLink`): open a session, start and
observe cells, terminate them, shut the session down; each queued on the sans-IO connection
and answered through the link's slots (`_slots.py`). The connection itself, its streams and its
failure are `_link_core.LinkCore`'s (its rules 1-4).
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from .._api import CellLimits, ExecuteRequest, SessionDelegate
from .._trio import CLEANUP_GRACE
from ..errors import HostLostError
from ..observability import TraceContext
from ._delegates import ClientCell
from ._link_core import CLOSE_TIMEOUT, ExecuteContext, LinkCore
from ._slots import HostResult, InitialResult


class HostLink(LinkCore):
    """A host and its connection (`LinkCore`), and the operations on it."""

    def _check(self) -> None:
        if self.failure is not None:
            raise self.failure
        if not self._connection.is_open:
            # The reader names the cause once the process has exited (rule 2).
            raise HostLostError(self._transport.closed_text)

    @property
    def _usable(self) -> bool:
        """Whether `_checked` would return at once: tested first on the paths of every cell,
        where awaiting it made a coroutine for nothing."""
        return self.failure is None and self._connection.is_open

    async def _checked(self) -> None:
        """`_check`, but a host that closed its end is given the time to exit, so that the
        error names its exit status (rule 2), as the reader will, and not only the closing."""
        if self.failure is None and not self._connection.is_open:
            with trio.move_on_after(CLOSE_TIMEOUT):
                await self._ended.wait()
        self._check()

    async def open_session(
        self,
        session_id: str,
        limits: CellLimits | None,
        *,
        store_load: bool = True,
        stored_values: dict[str, bytes] | None = None,
        on_commit: Callable[[dict[str, bytes]], None] | None = None,
    ) -> HostResult:
        """Open a session (`on_commit`: the session keeps its stored values, and is told each
        commit of its cells; `stored_values`: what it starts with)."""
        await self._checked()
        request_id = self._connection.open_session(
            session_id,
            limits,
            store_load=store_load,
            keep_stored_values=on_commit is not None,
            stored_values=stored_values,
        )
        if on_commit is not None:
            self._commit_sinks[session_id] = on_commit
        return await self._slots.answer(request_id, session_id)

    async def execute(
        self,
        session_id: str,
        request: ExecuteRequest,
        delegate: SessionDelegate,
        public_id: Callable[[str], str],
        *,
        to_pending: bool = False,
        trace: TraceContext | None = None,
    ) -> tuple[HostResult, int]:
        """Start a cell (`to_pending`: its initial observation runs to its pending frontier;
        `trace`: the cell's span, for the host); returns the answer and the execute's request
        id (the key of its initial response). Cancelled before the answer: the cell is
        terminated once admitted.

        Raises:
            FrameTooLargeError: the request does not fit in a frame (nothing was sent).
        """
        if not self._usable:
            await self._checked()
        request_id = self._connection.execute(
            session_id, request, to_pending=to_pending, trace=trace
        )
        self._executes[request_id] = ExecuteContext(session_id, delegate, public_id)
        return await self._slots.answer(request_id, session_id), request_id

    async def initial_response(self, request_id: int, session_id: str) -> InitialResult:
        """Take and await the initial response of execute `request_id` (cancelled: retired)."""
        orphaned = self._orphaned_initials.pop(request_id, None)
        if orphaned is None and (self.failure is not None or not self._connection.is_open):
            orphaned = self._connection.held_initials().get(request_id)  # it arrived first
        if orphaned is not None:
            return orphaned
        if self.failure is not None:
            raise self._slots.failure_of(session_id, self.failure)
        if not self._usable:
            await self._checked()
        self._connection.take_initial(request_id)
        result = await self._slots.initial(request_id, session_id)
        return result

    def release_initial(self, request_id: int) -> None:
        if self.alive:
            self._connection.release_initial(request_id)
            self._pump()

    def abandon(self, request_id: int, session_id: str, cell_id: str) -> None:
        """Terminate the cell of execute `request_id`: its caller went away without its id."""
        if self.alive:
            self._connection.abandon(request_id, session_id, cell_id)
            self._pump()

    async def wait(
        self,
        session_id: str,
        cell_id: str,
        yield_time_ms: int | None,
        trace: TraceContext | None = None,
    ) -> HostResult:
        """Observe a cell (`yield_time_ms` None: to its pending frontier; `trace`: the
        observation's span, for the host)."""
        await self._checked()
        return await self._slots.answer(
            self._connection.wait(session_id, cell_id, yield_time_ms, trace=trace), session_id
        )

    def preempt(self, session_id: str, cell_id: str) -> None:
        self._check()
        self._connection.preempt(session_id, cell_id)
        self._pump()

    async def terminate(self, session_id: str, cell_id: str) -> HostResult:
        await self._checked()
        return await self._slots.answer(self._connection.terminate(session_id, cell_id), session_id)

    async def shutdown_session(self, session_id: str) -> HostResult:
        await self._checked()
        self._commit_sinks.pop(session_id, None)
        return await self._slots.answer(self._connection.shutdown_session(session_id), session_id)

    async def cells(self, session_id: str) -> HostResult:
        """The session's live cells (`session/cells`), with the host's cell ids."""
        await self._checked()
        return await self._slots.answer(self._connection.cells(session_id), session_id)

    async def usage(self, session_id: str) -> HostResult:
        """What the session used of its budgets (`session/usage`)."""
        await self._checked()
        return await self._slots.answer(self._connection.usage(session_id), session_id)

    def cells_of(self, session_id: str) -> list[ClientCell]:
        """The session's cells that are live or closing (their `cell_closed` still to come)."""
        return self._cells.of_session(session_id)

    async def calls_started(self, session_id: str, cell_id: str) -> None:
        """Wait until the delegate saw every call the host made for the cell so far (bounded
        by the cleanup grace)."""
        await self._cells.all_started((session_id, cell_id), bound=CLEANUP_GRACE)

    async def settle(self, session_id: str, cell_id: str, *, closed: bool) -> None:
        """Wait until the cell's reverse calls returned (or, with `closed`, until its
        `cell_closed` ran), for at most the cleanup grace after they were cancelled.

        The host cancels a cell's calls before it answers with the cell's end; this makes
        that answer reach its caller after the application's delegate saw the cancellation,
        as in-process (design.md, design 4).
        """
        bound = CLOSE_TIMEOUT + CLEANUP_GRACE
        await self._cells.settle((session_id, cell_id), closed=closed, bound=bound)
