"""The requests of a wire session once their values were checked: starting a cell, taking its
initial response, observing it, terminating it (the rules are those of `_session.py`).

`WireSession` is the public half: it checks what the application hands it, keeps the
idempotency book and the shutdown, and calls this half with checked values. The split lets the
compiled build compile the path every cell takes (docs/compiled.md) while the class the
application holds stays an ordinary one: its checks name a wrong value before a compiled
signature would refuse it with its own `TypeError`, and its sessions take weak references.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Final

import msgspec
import trio

from .._api import (
    Completed,
    ExecuteRequest,
    LiveCell,
    Pending,
    RuntimeResponse,
    SessionDelegate,
    StartedCell,
    Terminated,
    WaitOutcome,
    Yielded,
)
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
    PENDING_FRONTIER_CAPABILITY,
    ExecutionStarted,
    FrameTooLargeError,
    LocalProtocolError,
)
from ._binding import Binding, unwrap
from ._generations import Generations, SessionOwner

UNCANCELLABLE_TIMEOUT = 60.0
"""Bound on terminate and a session's shutdown, which callers cannot cancel (design.md,
host 4.2)."""

# The kinds of a cell's response as tuples made once (C statics compiled), ended ones first:
# `isinstance(x, A | B)` builds the union on every call, and a class tested first that does not
# match costs about 600 instructions compiled (a msgspec class's `__instancecheck__`).
_INITIAL_KINDS: Final = (Completed, Yielded, Terminated)
_ENDED_KINDS: Final = (Completed, Terminated)


class SessionCore:
    """The cell requests of one wire session.

    Args:
        provider: the session's provider (whether it closed).
        generations: the session's bindings.
        traces: the session's traced cells.
        shutdown: the session's shutdown (whether it began).
        reopen: opens the session's next generation, once its host is lost (rule 5).
    """

    def __init__(
        self,
        provider: SessionOwner,
        generations: Generations,
        traces: SessionTraces,
        shutdown: RunOnce,
        reopen: Callable[[], Awaitable[Binding]],
    ) -> None:
        self._provider = provider
        self._generations = generations
        self._traces = traces
        self._shutdown = shutdown
        self._reopen = reopen
        self._terminating: set[str] = set()
        self._dropped: collections.deque[Callable[[], None]] = collections.deque()
        # The provider's trio run, the same for all of a session's cells (a `StartedCell`
        # releases itself through it): asked once, not for every cell.
        self._token: trio.lowlevel.TrioToken | None = None

    def check(self) -> None:
        """Raise unless the session takes requests (rule 3)."""
        if self._provider.closed:
            raise ProviderClosedError()
        if self._shutdown.started:
            raise SessionShuttingDownError()

    async def bind(self) -> Binding:
        """The binding a request goes to: the current one while its link lives."""
        self.check()
        binding = self._generations.binding
        if binding is not None and binding.link.alive:
            # No checkpoint: a request made now is queued before anything the caller's other
            # tasks do next (a wait issued before a tool's result goes out before it).
            return binding
        return await self._reopen()

    async def execute(
        self, request: ExecuteRequest, delegate: SessionDelegate, observe_initial: bool
    ) -> StartedCell:
        StartedCell._release_dropped(self._dropped)  # keeps the deque short between waits
        binding = await self.bind()
        traced = self._traces.begin(request, delegate, binding.session_id)
        if traced is None:
            request_id, wire_id = await self._start(binding, request, delegate, False, None)
        else:
            try:
                request_id, wire_id = await self._start(
                    binding, request, traced, False, traced.trace_context()
                )
            except BaseException as error:
                traced.refused(error)
                raise
            self._traces.started(traced, binding.public_id(wire_id), binding.generation)
        cell_id = binding.public_id(wire_id)
        if self._token is None:
            self._token = trio.lowlevel.current_trio_token()
        # An untraced cell's observation goes straight to the link: one coroutine fewer.
        take = self._take_initial_response if traced is None else self._initial_response
        return StartedCell._create(
            cell_id,
            partial(take, binding, request_id, cell_id),
            partial(binding.link.release_initial, request_id),
            self._dropped,
            session_id=binding.session_id,
            observe_initial=observe_initial,
            token=self._token,
        )

    async def _start(
        self,
        binding: Binding,
        request: ExecuteRequest,
        delegate: SessionDelegate,
        to_pending: bool,
        trace: TraceContext | None,
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
        except FrameTooLargeError as too_large:
            raise FrameLimitError(
                f"code-mode execute request exceeds the IPC frame limit: {too_large}"
            ) from None
        started = unwrap(result)
        if not isinstance(started, ExecutionStarted):
            raise HostLostError("code-mode host returned an invalid execute response")
        return request_id, started.cell_id

    async def _initial_response(
        self, binding: Binding, request_id: int, cell_id: str
    ) -> RuntimeResponse:
        """A traced cell's initial observation, in its span while the trace lasts."""
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
        if self._provider.closed:
            raise ProviderClosedError()  # rule 3, as in-process
        try:
            result = await binding.link.initial_response(request_id, binding.session_id)
        except LocalProtocolError:
            raise CodeModeError(initial_response_taken(cell_id)) from None
        response = unwrap(result, cell_id)
        assert isinstance(response, _INITIAL_KINDS)
        await self._settle(binding, response)
        return binding.response(response)

    async def _settle(self, binding: Binding, response: RuntimeResponse | Pending) -> None:
        """A cell's end reaches the caller after its delegate calls were cleaned up; a frontier
        after the delegate saw each call it lists."""
        if isinstance(response, _ENDED_KINDS):
            await binding.link.settle(binding.session_id, response.cell_id, closed=False)
        elif isinstance(response, Pending):
            await binding.link.calls_started(binding.session_id, response.cell_id)

    async def observe(self, cell_id: str, yield_time_ms: int | None) -> WaitOutcome:
        """A wait (`yield_time_ms` None: to the pending frontier), traced if its cell is."""
        traced = self._traces.get(cell_id)
        if traced is None:
            return await self._observe(cell_id, yield_time_ms, None)
        kind = "wait" if yield_time_ms is not None else "wait_to_pending"
        return await traced.observe(
            kind, lambda trace: self._observe(cell_id, yield_time_ms, trace), propagate=True
        )

    async def _observe(
        self, cell_id: str, yield_time_ms: int | None, trace: TraceContext | None
    ) -> WaitOutcome:
        """A wait, settled as its answer says."""
        StartedCell._release_dropped(self._dropped)
        binding = await self.bind()
        if yield_time_ms is None:
            binding.need(PENDING_FRONTIER_CAPABILITY, "the pending frontier")
        wire_id = binding.wire_id(cell_id)
        result = await binding.link.wait(binding.session_id, wire_id, yield_time_ms, trace)
        outcome = binding.outcome(result, cell_id)
        if isinstance(outcome, LiveCell):
            await self._settle(binding, msgspec.structs.replace(outcome.response, cell_id=wire_id))
        return outcome

    async def execute_to_pending(
        self, request: ExecuteRequest, delegate: SessionDelegate
    ) -> Pending | Completed | Terminated:
        StartedCell._release_dropped(self._dropped)
        binding = await self.bind()
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
        request_id, wire_id = await self._start(binding, request, delegate, True, trace)
        cell_id = binding.public_id(wire_id)
        try:
            response = unwrap(await link.initial_response(request_id, binding.session_id), cell_id)
        except BaseException:
            link.abandon(request_id, binding.session_id, wire_id)
            raise
        assert isinstance(response, Pending | Completed | Terminated)
        await self._settle(binding, response)
        return binding.response(response)

    async def terminate(self, cell_id: str) -> WaitOutcome:
        """Stop a cell (rule 2), traced if its cell is."""
        traced = self._traces.get(cell_id)
        if traced is not None:
            return await traced.observe("terminate", lambda _: self._terminate(cell_id))
        return await self._terminate(cell_id)

    async def _terminate(self, cell_id: str) -> WaitOutcome:
        binding = await self.bind()
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
