"""A session served by a host over the wire (implements `codemode.Session`): the one session
class of every provider whose cells run in a host (`codemode.process`, `codemode.remote`,
`codemode.ray`).

The session binds to a host link that its provider's placement strategy finds
(`_placement.Placement`: one host, a pool of host processes, listening hosts): opened eagerly by
`create_session`, re-opened after a host loss on the next operation, with the next
*generation*. Public cell ids carry the generation: generation 1 keeps the host's ids (`"1"`),
generation g > 1 prefixes them (`"g2:1"`); an id of another generation raises
`StaleGenerationError` (design.md, host 1.4). Only the strategy differs between providers: the
session asks it for a host, never for more.

Rules:
1. Errors from the host are turned into exceptions in one place: `errors.error_from_kind`, with
   the public cell id (never by matching text).
2. `terminate` is not cancellable (bounded by UNCANCELLABLE_TIMEOUT: past it the host is
   declared lost), but a deadline of its caller bounds it too (the host is then not blamed);
   `shutdown` runs as a task of the provider, so cancelling its caller does not stop it, and
   every later `shutdown()` waits for the same end.
3. After shutdown began every operation raises `SessionShuttingDownError`; after the provider
   closed, `ProviderClosedError`.
4. The pending frontier, preempt and the cell inventory need the host's capabilities; without
   them the operation raises a `CodeModeError` naming the capability.
5. Re-opening after a loss, announced or silent, and the stored values a session keeps for its
   next generation: `_generations.py` (its rules 1 and 2).
6. The idempotency keys of the session's requests are kept here, in the application's process
   (`_idempotency`), not in a host: they outlive a replaced host, and a key whose request ran
   on an earlier generation still answers with that outcome (its cell ids are that
   generation's: a new request on them raises `StaleGenerationError`).
"""

from __future__ import annotations

from functools import partial
from typing import final

import msgspec
import trio

from .._api import (
    CellInfo,
    CellLimits,
    Completed,
    ExecuteRequest,
    Pending,
    SessionDelegate,
    SessionUsage,
    StartedCell,
    Terminated,
    WaitOutcome,
    WaitRequest,
)
from .._checks import check_cell_id, check_execute, check_idempotency_key, check_wait
from .._idempotency import IdempotencyBook, request_fingerprint
from .._trio import RunOnce
from ..errors import HostLostError
from ..observability import SessionTraces
from ..protocol import (
    BUDGET_CAPABILITY,
    INVENTORY_CAPABILITY,
    YIELD_CAPABILITY,
    CellList,
    Err,
    UsageReport,
)
from ._binding import Binding, unwrap
from ._generations import Generations, SessionOwner
from ._session_core import UNCANCELLABLE_TIMEOUT, SessionCore


@final
class WireSession:
    """A code-mode session whose cells run in a host its provider placed it on."""

    def __init__(
        self,
        provider: SessionOwner,
        limits: CellLimits,
        *,
        store_load: bool = True,
        kind: str = "process",
        keep_stored_values: bool = False,
    ) -> None:
        self._provider = provider
        self._traces = SessionTraces(kind)
        self._generations = Generations(
            provider,
            limits,
            store_load=store_load,
            keep_stored_values=keep_stored_values,
            traces=self._traces,
        )
        self._shutdown = RunOnce()
        self._core = SessionCore(
            provider, self._generations, self._traces, self._shutdown, self._reopen
        )
        self._keys = IdempotencyBook()  # rule 6

    @property
    def is_alive(self) -> bool:
        """False once shutdown began, the provider closed, or while its host is lost (also
        after a re-opening that failed)."""
        if self._shutdown.started or self._provider.closed:
            return False
        return self._generations.alive

    async def _bind(self) -> Binding:
        return await self._core.bind()

    async def _reopen(self) -> Binding:
        return await self._generations.next(self, self._core.check)

    async def execute(
        self,
        request: ExecuteRequest,
        delegate: SessionDelegate,
        *,
        observe_initial: bool = True,
        idempotency_key: str | None = None,
    ) -> StartedCell:
        """Admit and start a cell in the host; its first response comes later
        (`observe_initial=False`: the `StartedCell` is released already; the host is told at
        once, and whatever its initial observation took goes to the cell's next `wait`).
        `idempotency_key`: a repeat returns a `StartedCell` of the same cell (rule 6).

        Cancelled before it returns, the cell (if the host admitted it) is terminated.
        """
        check_execute(request)
        if idempotency_key is None:
            return await self._core.execute(request, delegate, observe_initial)
        self._keyed(idempotency_key)
        return await self._keys.execute(
            idempotency_key,
            request,
            partial(self._core.execute, request, delegate, True),
            self.wait,
            observe_initial=observe_initial,
        )

    def _keyed(self, key: str | None) -> None:
        """Checks before a keyed request: the key, and the session's state (rule 3 holds for
        a repeat too, which the book would answer without asking the host)."""
        check_idempotency_key(key)
        if key is not None:
            self._core.check()

    async def wait(
        self, request: WaitRequest, *, idempotency_key: str | None = None
    ) -> WaitOutcome:
        """Observe a cell. Output a cancelled observation took is kept for the next one."""
        check_wait(request)
        self._keyed(idempotency_key)
        return await self._keys.run(
            idempotency_key,
            ("wait", request.cell_id, request.yield_time_ms),
            partial(self._core.observe, request.cell_id, request.yield_time_ms),
        )

    async def execute_to_pending(
        self,
        request: ExecuteRequest,
        delegate: SessionDelegate,
        *,
        idempotency_key: str | None = None,
    ) -> Pending | Completed | Terminated:
        """Admit a cell in the host and run it to its pending frontier, or its end.

        Cancelled before it returns, the cell (if the host admitted it) is terminated.
        """
        check_execute(request)
        self._keyed(idempotency_key)
        return await self._keys.run(
            idempotency_key,
            request_fingerprint("execute_to_pending", request),
            partial(self._core.execute_to_pending, request, delegate),
        )

    async def wait_to_pending(
        self, cell_id: str, *, idempotency_key: str | None = None
    ) -> WaitOutcome:
        """Resume a cell and observe it to its next pending frontier, or its end."""
        check_cell_id(cell_id)
        self._keyed(idempotency_key)
        return await self._keys.run(
            idempotency_key,
            ("wait_to_pending", cell_id),
            partial(self._core.observe, cell_id, None),
        )

    async def preempt(self, cell_id: str) -> None:
        """Make the cell's active observation return `Yielded` now (no effect on frontier
        observers, or when nothing observes it)."""
        check_cell_id(cell_id)
        binding = await self._bind()
        binding.need(YIELD_CAPABILITY, "preempting an observation")
        binding.link.preempt(binding.session_id, binding.wire_id(cell_id))
        await trio.lowlevel.checkpoint()

    async def cells(self) -> list[CellInfo]:
        """The session's live cells in its host, oldest first, with their public ids."""
        binding = await self._bind()
        binding.need(INVENTORY_CAPABILITY, "the cell inventory")
        listed = unwrap(await binding.link.cells(binding.session_id))
        if not isinstance(listed, CellList):
            raise HostLostError("code-mode host returned an invalid cell list response")
        return [
            msgspec.structs.replace(cell, cell_id=binding.public_id(cell.cell_id))
            for cell in listed.cells
        ]

    async def usage(self) -> SessionUsage:
        """What the session used of its budgets in its host (a session re-opened on a new host
        counts anew there)."""
        binding = await self._bind()
        binding.need(BUDGET_CAPABILITY, "session usage")
        reported = unwrap(await binding.link.usage(binding.session_id))
        if not isinstance(reported, UsageReport):
            raise HostLostError("code-mode host returned an invalid usage response")
        return reported.usage

    async def terminate(self, cell_id: str, *, idempotency_key: str | None = None) -> WaitOutcome:
        """Stop a cell in the host; returns its undelivered output or buffered completion.

        Returns once the cell's delegate calls returned and its `cell_closed` ran (each
        bounded by the cleanup grace), as in-process. A second terminate meanwhile raises
        `AlreadyTerminatingError`.
        """
        check_cell_id(cell_id)
        self._keyed(idempotency_key)
        return await self._keys.run(
            idempotency_key, ("terminate", cell_id), partial(self._core.terminate, cell_id)
        )

    async def shutdown(self) -> None:
        """Reject new operations, shut the host session down, return after every
        `cell_closed` (rule 2).

        Raises:
            Exception: what made the shutdown itself fail (every caller sees it); the
                session is shut down all the same.
        """
        await self._shutdown.run(self._provider.nursery, self._shut_down)

    async def _shut_down(self) -> None:
        try:
            bindings = await self._generations.all_bindings()
            for binding in bindings:
                await self._close(binding)
        finally:
            self._provider.forget(self)

    async def _close(self, binding: Binding) -> None:
        link = binding.link
        if link.alive:
            with trio.move_on_after(UNCANCELLABLE_TIMEOUT) as bounded:
                try:
                    result = await link.shutdown_session(binding.session_id)
                except HostLostError:
                    pass  # every cell of the link gets its cell_closed anyway
                else:
                    if isinstance(result, Err):
                        # The host could not close the session: its cells are in an unknown
                        # state, so the link is (design.md, host 4.3).
                        link.abort(
                            f"code-mode host failed to shut a session down: {result.message}"
                        )
            if bounded.cancelled_caught:
                link.abort("code-mode host timed out waiting for shutdown response")
        # The host sent every cell/closed before session/closed (or the link failed and
        # closed them all): wait for their cell_closed callbacks.
        for cell in link.cells_of(binding.session_id):
            await cell.wait_closed()
