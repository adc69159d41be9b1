"""A session served by a host process (implements `codemode.Session`).

The session binds to the provider's current host connection: opened on first use (or eagerly by
`create_session`), re-opened after a host loss on the next operation, with the next
*generation*. Public cell ids carry the generation: generation 1 keeps the host's ids (`"1"`),
generation g > 1 prefixes them (`"g2:1"`); an id of another generation is refused with
`cell <id> belongs to a stale code-mode host generation` (reference-host 1.4).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import msgspec
import trio

from .._api import (
    CellLimits,
    ExecuteRequest,
    LiveCell,
    RuntimeResponse,
    SessionDelegate,
    StartedCell,
    WaitOutcome,
    WaitRequest,
)
from .._oneshot import OneShot
from ..errors import CodeModeError, ObserverBusyError, SessionShuttingDownError, error_from_message
from ..protocol import (
    LIMITS_CAPABILITY,
    Err,
    Ok,
    OpenSession,
    SessionClosed,
    SessionReady,
    ShutdownSession,
    Terminate,
    Wait,
    WaitCompleted,
)
from ._connection import HostConnection, HostResult, InitialSlot

if TYPE_CHECKING:
    from ._provider import ProcessProvider


class _Initial:
    """The initial response of one execute, until someone takes it."""

    __slots__ = ("released", "request_id", "slot", "taken")

    def __init__(self, request_id: int, slot: InitialSlot) -> None:
        self.request_id = request_id
        self.slot = slot
        self.taken = False
        self.released = False


class _Binding:
    """The session as opened on one host connection."""

    def __init__(self, connection: HostConnection, session_id: str, generation: int) -> None:
        self.connection = connection
        self.session_id = session_id
        self.generation = generation
        self.retiring_waits: dict[str, OneShot[HostResult]] = {}
        self.initials: dict[str, _Initial] = {}

    def public_id(self, wire_id: str) -> str:
        return wire_id if self.generation == 1 else f"g{self.generation}:{wire_id}"

    def wire_id(self, public_id: str) -> str:
        if self.generation == 1:
            if public_id.startswith("g") and ":" in public_id:
                raise CodeModeError(
                    f"cell {public_id} belongs to a stale code-mode host generation"
                )
            return public_id
        prefix = f"g{self.generation}:"
        if not public_id.startswith(prefix):
            raise CodeModeError(f"cell {public_id} belongs to a stale code-mode host generation")
        return public_id[len(prefix) :]

    def response(self, response: RuntimeResponse) -> RuntimeResponse:
        return msgspec.structs.replace(response, cell_id=self.public_id(response.cell_id))

    def outcome(self, outcome: WaitOutcome) -> WaitOutcome:
        return msgspec.structs.replace(outcome, response=self.response(outcome.response))


class ProcessSession:
    """A code-mode session whose cells run in the provider's host process."""

    def __init__(self, provider: ProcessProvider, limits: CellLimits) -> None:
        self._provider = provider
        self._limits = limits
        self._binding: _Binding | None = None
        self._retired: list[_Binding] = []
        self._generation = 0
        self._shutting_down = False
        self._shutdown_done: trio.Event | None = None
        self._bind_lock = trio.Lock()

    @property
    def is_alive(self) -> bool:
        """False once shutdown began, or while its host connection is lost."""
        if self._shutting_down:
            return False
        return self._binding is None or self._binding.connection.alive

    async def _bind(self) -> _Binding:
        if self._shutting_down:
            raise SessionShuttingDownError()
        async with self._bind_lock:
            if self._shutting_down:
                raise SessionShuttingDownError()
            binding = self._binding
            if binding is not None and binding.connection.alive:
                return binding
            if binding is not None:
                self._retired.append(binding)
                self._binding = None
            connection = await self._provider._connection()
            limits = None
            if self._limits != CellLimits():
                if LIMITS_CAPABILITY not in connection.capabilities:
                    raise CodeModeError(
                        "code-mode host does not support session resource limits: missing"
                        f" `{LIMITS_CAPABILITY}` capability"
                    )
                limits = self._limits
            session_id = self._provider._next_session_id()
            response = await connection.request(
                OpenSession(session_id=session_id, cell_execution_limits=limits)
            )
            if not isinstance(response, SessionReady) or response.session_id != session_id:
                raise CodeModeError("code-mode host returned an invalid open-session response")
            self._generation += 1
            self._binding = _Binding(connection, session_id, self._generation)
            return self._binding

    async def execute(self, request: ExecuteRequest, delegate: SessionDelegate) -> StartedCell:
        """Admit and start a cell in the host; its first response comes later."""
        binding = await self._bind()
        wire_id, request_id, slot = await binding.connection.execute(
            binding.session_id, request, delegate, binding.public_id
        )
        initial = _Initial(request_id, slot)
        binding.initials[wire_id] = initial

        async def initial_response() -> RuntimeResponse:
            return await self._initial_response(binding, wire_id, initial)

        started = StartedCell(binding.public_id(wire_id), initial_response)
        # Dropped unawaited: the host's initial observation is released for later waits.
        weakref.finalize(started, self._release_initial, binding, initial)
        return started

    def _release_initial(self, binding: _Binding, initial: _Initial) -> None:
        initial.released = True
        if not initial.slot.is_set():
            binding.connection.cancel_operation(initial.request_id)

    async def _initial_response(
        self, binding: _Binding, wire_id: str, initial: _Initial
    ) -> RuntimeResponse:
        if initial.taken:
            raise CodeModeError(
                f"the initial response of exec cell {binding.public_id(wire_id)} was already taken"
            )
        initial.released = False
        try:
            result = await initial.slot.get()
        except trio.Cancelled:
            self._release_initial(binding, initial)
            raise
        initial.taken = True
        binding.initials.pop(wire_id, None)
        if isinstance(result, Err):
            raise error_from_message(result.message)
        return binding.response(result.value)

    async def wait(self, request: WaitRequest) -> WaitOutcome:
        """Observe a cell.

        An initial response nobody took is this observation (output is never lost); a wait
        cancelled earlier is retired before this one is sent.
        """
        binding = await self._bind()
        wire_id = binding.wire_id(request.cell_id)
        initial = binding.initials.get(wire_id)
        if initial is not None and not initial.taken:
            if not initial.released:
                raise ObserverBusyError(request.cell_id)
            result = await initial.slot.get()
            binding.initials.pop(wire_id, None)
            if not initial.taken:
                initial.taken = True
                if isinstance(result, Ok):
                    return LiveCell(response=binding.response(result.value))
        retiring = binding.retiring_waits.pop(wire_id, None)
        if retiring is not None:
            await retiring.wait()

        def retire(answer: OneShot[HostResult]) -> None:
            binding.retiring_waits[wire_id] = answer

        response = await binding.connection.request(
            Wait(
                session_id=binding.session_id,
                request=WaitRequest(cell_id=wire_id, yield_time_ms=request.yield_time_ms),
            ),
            on_abandon=retire,
        )
        return self._outcome(binding, response, wire_id)

    async def terminate(self, cell_id: str) -> WaitOutcome:
        """Stop a cell in the host; returns its undelivered output or buffered completion."""
        binding = await self._bind()
        wire_id = binding.wire_id(cell_id)
        response = await binding.connection.request(
            Terminate(session_id=binding.session_id, cell_id=wire_id), cancellable=False
        )
        return self._outcome(binding, response, wire_id)

    def _outcome(self, binding: _Binding, response: object, wire_id: str) -> WaitOutcome:
        if not isinstance(response, WaitCompleted):
            raise CodeModeError("code-mode host returned an invalid cell response")
        if response.outcome.response.cell_id != wire_id:
            raise CodeModeError(
                f"code-mode host returned cell {response.outcome.response.cell_id}"
                f" for request targeting {wire_id}"
            )
        return binding.outcome(response.outcome)

    async def shutdown(self) -> None:
        """Reject new operations, shut the host session down, return after every cell_closed."""
        if self._shutdown_done is not None:
            await self._shutdown_done.wait()
            return
        self._shutting_down = True
        self._shutdown_done = done = trio.Event()
        try:
            async with self._bind_lock:
                bindings = [*self._retired, *([self._binding] if self._binding else [])]
            for binding in bindings:
                await self._close(binding)
        finally:
            done.set()

    async def _close(self, binding: _Binding) -> None:
        connection = binding.connection
        if connection.alive:
            try:
                response = await connection.request(
                    ShutdownSession(session_id=binding.session_id), cancellable=False
                )
            except CodeModeError:
                if connection.alive:
                    raise
            else:
                if not isinstance(response, SessionClosed):
                    raise CodeModeError("code-mode host returned an invalid shutdown response")
        # The host sent every cell/closed before session/closed (or the connection failed and
        # closed them all): wait for their cell_closed callbacks.
        for cell in connection.cells_of(binding.session_id):
            await cell.closed.wait()
