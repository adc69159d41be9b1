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

import collections
import math
from collections.abc import Callable
from functools import partial
from typing import final

import msgspec
import trio

from .._api import (
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
)
from .._checks import check_cell_id, check_execute, check_idempotency_key, check_wait
from .._idempotency import IdempotencyBook, request_fingerprint
from .._trio import RunOnce
from ..errors import (
    AlreadyTerminatingError,
    CodeModeError,
    FrameLimitError,
    HostLostError,
    ProviderClosedError,
    SessionShuttingDownError,
    initial_response_taken,
)
from ..observability import CellTrace, SessionTraces, TraceContext
from ..protocol import (
    BUDGET_CAPABILITY,
    INVENTORY_CAPABILITY,
    PENDING_FRONTIER_CAPABILITY,
    YIELD_CAPABILITY,
    CellList,
    Err,
    ExecutionStarted,
    FrameTooLargeError,
    LocalProtocolError,
    UsageReport,
)
from ._binding import Binding, unwrap
from ._generations import Generations, SessionOwner

UNCANCELLABLE_TIMEOUT = 60.0
"""Bound on terminate and a session's shutdown, which callers cannot cancel (design.md,
host 4.2)."""


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
        self._terminating: set[str] = set()
        self._dropped: collections.deque[Callable[[], None]] = collections.deque()
        self._keys = IdempotencyBook()  # rule 6

    @property
    def is_alive(self) -> bool:
        """False once shutdown began, the provider closed, or while its host is lost (also
        after a re-opening that failed)."""
        if self._shutdown.started or self._provider.closed:
            return False
        return self._generations.alive

    def _check(self) -> None:
        if self._provider.closed:
            raise ProviderClosedError()
        if self._shutdown.started:
            raise SessionShuttingDownError()

    async def _bind(self) -> Binding:
        self._check()
        binding = self._generations.binding
        if binding is not None and binding.link.alive:
            # No checkpoint: a request made now is queued before anything the caller's other
            # tasks do next (a wait issued before a tool's result goes out before it).
            return binding
        return await self._generations.next(self, self._check)

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
            return await self._execute(request, delegate, observe_initial)
        self._keyed(idempotency_key)
        return await self._keys.execute(
            idempotency_key,
            request,
            partial(self._execute, request, delegate, True),
            self.wait,
            observe_initial=observe_initial,
        )

    def _keyed(self, key: str | None) -> None:
        """Checks before a keyed request: the key, and the session's state (rule 3 holds for
        a repeat too, which the book would answer without asking the host)."""
        check_idempotency_key(key)
        if key is not None:
            self._check()

    async def _execute(
        self, request: ExecuteRequest, delegate: SessionDelegate, observe_initial: bool
    ) -> StartedCell:
        StartedCell._release_dropped(self._dropped)  # keeps the deque short between waits
        binding = await self._bind()
        traced = self._traces.begin(request, delegate, binding.session_id)
        if traced is None:
            request_id, wire_id = await self._start(binding, request, delegate, to_pending=False)
        else:
            try:
                request_id, wire_id = await self._start(
                    binding, request, traced, to_pending=False, trace=traced.trace_context()
                )
            except BaseException as error:
                traced.refused(error)
                raise
            self._traces.started(traced, binding.public_id(wire_id), binding.generation)
        cell_id = binding.public_id(wire_id)
        return StartedCell._create(
            cell_id,
            partial(self._initial_response, binding, request_id, cell_id),
            partial(binding.link.release_initial, request_id),
            self._dropped,
            session_id=binding.session_id,
            observe_initial=observe_initial,
        )

    async def _start(
        self,
        binding: Binding,
        request: ExecuteRequest,
        delegate: SessionDelegate,
        *,
        to_pending: bool,
        trace: TraceContext | None = None,
    ) -> tuple[int, str]:
        """Have the host admit a cell: the execute's request id and the cell's wire id."""
        try:
            result, request_id = await binding.link.execute(
                binding.session_id,
                request,
                delegate,
                binding.public_id,
                to_pending=to_pending,
                trace=trace,
            )
        except FrameTooLargeError as error:
            raise FrameLimitError(
                f"code-mode execute request exceeds the IPC frame limit: {error}"
            ) from None
        started = unwrap(result)
        if not isinstance(started, ExecutionStarted):
            raise HostLostError("code-mode host returned an invalid execute response")
        return request_id, started.cell_id

    async def _initial_response(
        self, binding: Binding, request_id: int, cell_id: str
    ) -> RuntimeResponse:
        if self._provider.closed:
            raise ProviderClosedError()  # rule 3, as in-process
        traced = self._traces.get(cell_id)
        if traced is not None:
            return await traced.observe(
                "initial_response",
                lambda _: self._take_initial_response(binding, request_id, cell_id),
            )
        return await self._take_initial_response(binding, request_id, cell_id)

    async def _take_initial_response(
        self, binding: Binding, request_id: int, cell_id: str
    ) -> RuntimeResponse:
        try:
            result = await binding.link.initial_response(request_id, binding.session_id)
        except LocalProtocolError:
            raise CodeModeError(initial_response_taken(cell_id)) from None
        response = unwrap(result, cell_id)
        assert isinstance(response, Yielded | Completed | Terminated)
        await self._settle(binding, response)
        return binding.response(response)

    async def _settle(self, binding: Binding, response: RuntimeResponse | Pending) -> None:
        """A cell's end reaches the caller after its delegate calls were cleaned up; a frontier
        after the delegate saw each call it lists."""
        if isinstance(response, Pending):
            await binding.link.calls_started(binding.session_id, response.cell_id)
        elif isinstance(response, Completed | Terminated):
            await binding.link.settle(binding.session_id, response.cell_id, closed=False)

    async def wait(
        self, request: WaitRequest, *, idempotency_key: str | None = None
    ) -> WaitOutcome:
        """Observe a cell. Output a cancelled observation took is kept for the next one."""
        check_wait(request)
        self._keyed(idempotency_key)
        return await self._keys.run(
            idempotency_key,
            ("wait", request.cell_id, request.yield_time_ms),
            partial(self._traced_observe, request.cell_id, request.yield_time_ms),
        )

    async def _traced_observe(self, cell_id: str, yield_time_ms: int | None) -> WaitOutcome:
        traced = self._traces.get(cell_id)
        if traced is None:
            return await self._observe(cell_id, yield_time_ms)
        kind = "wait" if yield_time_ms is not None else "wait_to_pending"
        return await traced.observe(
            kind, lambda trace: self._observe(cell_id, yield_time_ms, trace), propagate=True
        )

    async def _observe(
        self, cell_id: str, yield_time_ms: int | None, trace: TraceContext | None = None
    ) -> WaitOutcome:
        """A wait (`yield_time_ms` None: to the pending frontier), settled as its answer says."""
        StartedCell._release_dropped(self._dropped)
        binding = await self._bind()
        if yield_time_ms is None:
            binding.need(PENDING_FRONTIER_CAPABILITY, "the pending frontier")
        wire_id = binding.wire_id(cell_id)
        result = await binding.link.wait(binding.session_id, wire_id, yield_time_ms, trace)
        outcome = binding.outcome(result, cell_id)
        if isinstance(outcome, LiveCell):
            await self._settle(binding, msgspec.structs.replace(outcome.response, cell_id=wire_id))
        return outcome

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
            partial(self._execute_to_pending_traced, request, delegate),
        )

    async def _execute_to_pending_traced(
        self, request: ExecuteRequest, delegate: SessionDelegate
    ) -> Pending | Completed | Terminated:
        StartedCell._release_dropped(self._dropped)
        binding = await self._bind()
        binding.need(PENDING_FRONTIER_CAPABILITY, "the pending frontier")
        traced = self._traces.begin(request, delegate, binding.session_id)
        if traced is None:
            return await self._execute_to_pending(binding, request, delegate, None)
        try:
            response = await traced.observe(
                "execute_to_pending",
                lambda _: self._execute_to_pending(binding, request, traced, traced),
            )
        except BaseException as error:
            if not traced.cell_id:
                traced.refused(error)
            raise
        self._traces.started(traced, response.cell_id, binding.generation)
        return response

    async def _execute_to_pending(
        self,
        binding: Binding,
        request: ExecuteRequest,
        delegate: SessionDelegate,
        traced: CellTrace | None,
    ) -> Pending | Completed | Terminated:
        link = binding.link
        trace = None if traced is None else traced.trace_context()
        request_id, wire_id = await self._start(
            binding, request, delegate, to_pending=True, trace=trace
        )
        cell_id = binding.public_id(wire_id)
        try:
            response = unwrap(await link.initial_response(request_id, binding.session_id), cell_id)
        except BaseException:
            link.abandon(request_id, binding.session_id, wire_id)
            raise
        assert isinstance(response, Pending | Completed | Terminated)
        await self._settle(binding, response)
        return binding.response(response)

    async def wait_to_pending(
        self, cell_id: str, *, idempotency_key: str | None = None
    ) -> WaitOutcome:
        """Resume a cell and observe it to its next pending frontier, or its end."""
        check_cell_id(cell_id)
        self._keyed(idempotency_key)
        return await self._keys.run(
            idempotency_key,
            ("wait_to_pending", cell_id),
            partial(self._traced_observe, cell_id, None),
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
            idempotency_key, ("terminate", cell_id), partial(self._traced_terminate, cell_id)
        )

    async def _traced_terminate(self, cell_id: str) -> WaitOutcome:
        traced = self._traces.get(cell_id)
        if traced is not None:
            return await traced.observe("terminate", lambda _: self._terminate(cell_id))
        return await self._terminate(cell_id)

    async def _terminate(self, cell_id: str) -> WaitOutcome:
        binding = await self._bind()
        wire_id = binding.wire_id(cell_id)
        if cell_id in self._terminating:
            raise AlreadyTerminatingError(cell_id)
        self._terminating.add(cell_id)
        # A caller's deadline (`trio.move_on_after` around the call) bounds the wait too; a
        # cancellation does not (rule 2).
        own_deadline = trio.current_time() + UNCANCELLABLE_TIMEOUT
        callers_deadline = trio.current_effective_deadline()
        if callers_deadline == -math.inf:
            callers_deadline = math.inf
        try:
            with trio.CancelScope(shield=True) as bounded:
                bounded.deadline = min(own_deadline, callers_deadline)
                result = await binding.link.terminate(binding.session_id, wire_id)
                outcome = binding.outcome(result, cell_id)
                if isinstance(outcome, LiveCell):
                    ended = isinstance(outcome.response, Terminated)
                    await binding.link.settle(binding.session_id, wire_id, closed=ended)
        finally:
            self._terminating.discard(cell_id)
        if bounded.cancelled_caught:
            if callers_deadline < own_deadline:
                # The caller's bound passed first: the host is not at fault, and the caller's
                # scope takes its Cancelled here.
                await trio.lowlevel.checkpoint()
            binding.link.abort("code-mode host timed out waiting for terminate response")
            assert binding.link.failure is not None
            raise binding.link.failure
        return outcome

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
            await cell.closed.wait()
