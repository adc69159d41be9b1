"""One host link's connection: the trio adapter around `ClientConnection`, its streams and its
failure (`LinkCore`); `HostLink` (`_link.py`) adds the operations a session makes on it.

The protocol's rules live in the sans-IO `ClientConnection`; the link only moves bytes and
runs tasks, all in a nursery of its own that `run` opens (started with `nursery.start` once the
handshake succeeded). Its streams come from a `HostTransport` (`_transport.py`): a spawned host
process (`codemode.process`) or a socket to a listening host (`codemode.remote`).

- the stream it is on (`_stream.py`: its writer, reader and heartbeat): the reader feeds bytes
  to the connection, and the link dispatches its events (`_pump`): answers go to their
  callers' slots (`_slots.py`), reverse calls and cell closings to the link's cells
  (`_delegates.ClientCells`);
- the transport's own tasks: for a spawned host, the supervisor waits for the process and
  stderr is forwarded from the moment of the spawn.

Rules:
1. The first failure wins (`_lost`): every slot gets a `HostLostError` with its text (the
   cause chained), every call in flight is cancelled, every live cell gets exactly one
   `cell_closed`, the process is killed and reaped (the socket closed).
2. A host that exits is reported only once its stdout is drained (bounded): answers it wrote
   before exiting still reach their callers.
3. Once started, the link's tasks are shielded from the provider's cancellation (the provider's
   bounded shutdown still needs the reader); `aclose()` lifts that, with a deadline.
4. A cut stream is not a loss when the connection can be resumed (`RESUME_CAPABILITY`, over a
   transport that can reconnect): the link reconnects with a backoff until the host's grace
   ends, presents its token, and both sides replay what the other missed (`_resume.py`).
   Operations made meanwhile are queued; nothing reaches the application. A refused or
   expired resume is a loss (rule 1), and what was in flight or queued then fails with
   `RuntimeReplacedError` (`_slots.py`). A host that stops answering on an open stream is a
   loss too (the heartbeat): a resume covers a cut, not a silent host. `aclose()` says
   goodbye first, so the host frees the sessions at once.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Final

import trio

from .._api import AdmissionLimits, SessionDelegate
from .._trio import (
    CLEANUP_GRACE,
    CallWorkers,
    DelegateCall,
    OneShot,
    open_service_nursery,
)
from ..errors import HostLostError
from ..protocol import (
    CAPABILITIES,
    HEARTBEAT_CAPABILITY,
    NEED_DATA,
    RESUME_CAPABILITY,
    Answered,
    CellEnded,
    ClientConnection,
    ClientEvent,
    ClientStatistics,
    ConnectionEnded,
    ConnectionResumed,
    DelegateCancelled,
    DelegateRequested,
    ExecutionStarted,
    GoodbyeReceived,
    HandshakeCompleted,
    HandshakeRejected,
    InitialAnswered,
    Ok,
    RemoteProtocolError,
    ResumeFailed,
    StoredValuesCommitted,
    describe_rejection,
)
from ._delegates import ClientCells
from ._resume import Resumer
from ._slots import AnswerSlots, InitialResult
from ._stream import LinkStream
from ._transport import DRAIN_TIMEOUT, HostTransport

# The events every cell brings (`_dispatch`) and the answer of an execute: `Final`, C statics
# in the compiled build, compared with an event's exact type. The connection makes exactly these
# classes, and a failed `isinstance` against a msgspec class costs the compiled build about 600
# instructions: a `match` took fourteen of them a cell (docs/compiled.md).
_ANSWERED: Final = Answered
_INITIAL_ANSWERED: Final = InitialAnswered
_DELEGATE_REQUESTED: Final = DelegateRequested
_CELL_ENDED: Final = CellEnded
_OK: Final = Ok
_EXECUTION_STARTED: Final = ExecutionStarted

# The process provider's logger, where the links have always logged (the remote provider's too).
logger = logging.getLogger("codemode.process")

HANDSHAKE_TIMEOUT = 10.0
CLOSE_TIMEOUT = 5.0
"""Seconds a closing host has to exit after its stdin closed, before it is killed."""


class ExecuteContext:
    """What an execute needs once the host admits its cell."""

    __slots__ = ("delegate", "public_id", "session_id")

    def __init__(
        self, session_id: str, delegate: SessionDelegate, public_id: Callable[[str], str]
    ) -> None:
        self.session_id = session_id
        self.delegate = delegate
        self.public_id = public_id


class LinkCore:
    """A host and its connection, from spawn (or connect) to loss. Started by `run`; the
    operations are `HostLink`'s.

    Args:
        transport: what starts or reaches the host (`codemode.process`: a spawned host;
            `codemode.remote`: a socket).
        handshake_timeout: seconds the host has to answer the hello.
        workers: where the application's delegate calls run (its provider's); by default in
            the link's own nursery.
    """

    def __init__(
        self,
        transport: HostTransport,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
        *,
        workers: CallWorkers | None = None,
    ) -> None:
        self._transport = transport
        self._handshake_timeout = handshake_timeout
        offered = [
            capability
            for capability in CAPABILITIES
            if capability != RESUME_CAPABILITY or transport.resumable
        ]
        self._connection = ClientConnection(
            optional_capabilities=offered,
            codemode_version=self._transport.codemode_version,
            token=self._transport.token,
        )
        self._opened = False
        self._closing = False
        self._life: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None
        self._stream: LinkStream | None = None
        self._resumer: Resumer | None = None
        self._handshake: OneShot[HandshakeCompleted | HandshakeRejected | None] = OneShot()
        self._executes: dict[int, ExecuteContext] = {}
        self._orphaned_initials: dict[int, InitialResult] = {}
        self._commit_sinks: dict[str, Callable[[dict[str, bytes]], None]] = {}
        self._cells = ClientCells(self._connection, self._flush, workers)
        self._slots = AnswerSlots(self._connection, self._pump, self._commit_sinks.__contains__)
        self._stdout_done = trio.Event()
        self._ended = trio.Event()
        self._finished = trio.Event()
        self.failure: HostLostError | None = None

    @property
    def alive(self) -> bool:
        """False once the link failed, and already while its host's last bytes are read
        after an end of file (new operations then go to a new host)."""
        return self.failure is None and self._connection.is_open

    @property
    def capabilities(self) -> frozenset[str]:
        return self._connection.capabilities

    @property
    def admission(self) -> AdmissionLimits | None:
        """The limits the host advertised in its handshake (None: it did not)."""
        return self._connection.admission

    @property
    def pid(self) -> int | None:
        """The host process's id (None before it was spawned, or not a spawned host)."""
        return self._transport.pid

    def statistics(self) -> ClientStatistics:
        """What the connection holds: its cells, sessions, requests (a pool's measure of load)."""
        return self._connection.statistics()

    # ---- lifecycle -------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Spawn (or reach) the host, shake hands, then serve until the link is lost or closed.

        Raises (before `started`, to the caller of `nursery.start`):
            HostLostError: the host could not be spawned or reached, exited, refused or did
                not answer the handshake in time; the text ends with its last stderr lines.
        """
        send, receive = await self._transport.open()
        self._opened = True
        try:
            with trio.CancelScope() as self._life:
                async with open_service_nursery() as nursery:
                    self._nursery = nursery
                    self._cells.serve_in(nursery)
                    self._transport.start(nursery, self._lost, self._stdout_done)
                    self.attach(send, receive)
                    await self._shake_hands()
                    self._watch()
                    self._life.shield = True  # rule 3
                    task_status.started()
                    await self._ended.wait()
                    await self._cells.wait_closing()
                    nursery.cancel_scope.cancel()
        finally:
            # However the link ends (a bug raising out of its tasks too), nothing waits on it.
            self._lost("code-mode host connection ended")
            if self._stream is not None:
                self._stream.stop_reading()  # it reads in the workers, not in the nursery
            with trio.CancelScope(shield=True):
                await self._transport.reap()
            self._finished.set()

    async def _shake_hands(self) -> None:
        """Wait for the host's answer to the hello (queued by the connection)."""
        self._flush()
        answer: HandshakeCompleted | HandshakeRejected | None = None
        with trio.move_on_after(self._handshake_timeout) as timer:
            answer = await self._handshake.get()
        if isinstance(answer, HandshakeCompleted):
            return
        status = self._transport.exit_status()
        if timer.cancelled_caught:
            reason = "timed out negotiating with the code-mode host"
        elif isinstance(answer, HandshakeRejected):
            reason = describe_rejection(answer.reason)
        elif self.failure is not None and self.failure.__cause__ is not None:
            # A frame that broke the protocol (or a failed read or write) names the cause;
            # the exit status would be our own kill's, -9 (tests/test_fuzz_client.py).
            reason = str(self.failure)
        elif status is not None:
            reason = f"code-mode host exited during handshake with status {status}"
        else:
            assert self.failure is not None
            reason = str(self.failure)
        cause = self.failure.__cause__ if self.failure is not None else None
        self._lost(reason)
        with trio.move_on_after(DRAIN_TIMEOUT):
            await self._transport.last_words()  # they explain the failure
        raise HostLostError(self._transport.describe(reason)) from cause

    def attach(self, send: trio.abc.SendStream, receive: trio.abc.ReceiveStream) -> None:
        """Read and write these streams from now on (the first, or a resumed one: rule 4)."""
        assert self._nursery is not None
        self._stream = LinkStream(self, send, receive, self._connection.take_outgoing)
        self._stream.start(self._nursery, self._cells.workers)

    def _watch(self) -> None:
        """Watch the host on the current stream (with the heartbeat capability)."""
        if self._stream is not None and HEARTBEAT_CAPABILITY in self._connection.capabilities:
            assert self._nursery is not None
            self._stream.watch(self._nursery, self._ping, self._silent)

    def stream_cut(self, stream: LinkStream, reason: str) -> bool:
        """The stream was cut: let go of it and resume (rule 4). False: the connection cannot
        be resumed (or is being closed), and the cut is a loss."""
        if stream is not self._stream:
            return True  # let go of already
        if not self._connection.resumable or self._closing or self.failure is not None:
            return False
        stream.let_go()
        self._stream = None
        self._connection.suspend()
        if self._resumer is not None:
            self._resumer.cut()  # an attempt's stream: the resumer tries again
            return True
        assert self._nursery is not None
        grace = self._connection.resume_grace or 0.0
        self._resumer = Resumer(self._transport, self, grace, reason)
        self._nursery.start_soon(self._resumer.run)
        return True

    def stream_failed(self, reason: str, cause: BaseException) -> None:
        self._lost(reason, cause)

    async def stream_ended(self) -> None:
        self._stdout_done.set()
        self._lost(await self._transport.ended())  # rule 2: the exit status, once known

    def received(self, data: bytes | bytearray, calls: deque[DelegateCall]) -> bool:
        try:
            self._connection.receive_data(data)
        except RemoteProtocolError as error:  # pragma: no cover - the connection failed before
            self._lost(f"failed to read code-mode host message: {error}", error)
            return False
        self._pump(calls)
        return self._connection.is_open

    def resuming(self) -> None:
        """The resumer reached the host again: queue the resume for the new stream."""
        self._connection.begin_resume()

    def resume_failed(self, reason: str) -> None:
        """The cut connection could not be resumed: lost, and what was in flight or queued
        fails with `RuntimeReplacedError` (rule 4)."""
        self._slots.not_resumed = True
        self._lost(reason)

    def announced_replacement(self, session_id: str) -> bool:
        """An operation of the session already raised `RuntimeReplacedError` for this link's
        loss (its next generation need not say it again)."""
        return self._slots.announced(session_id)

    def resumed(self) -> None:
        """The resumer is done: the host took the resume (rule 4)."""
        self._resumer = None
        self._watch()
        self._flush()

    async def aclose(self) -> None:
        """Close the host's stdin so it shuts down and exits (killed after CLOSE_TIMEOUT),
        then end the link: its live cells get `cell_closed`. Bounded; idempotent."""
        self._closing = True
        if self._opened and self.alive:
            writer = self._stream.writer if self._stream is not None else None
            self._connection.goodbye()  # a host that resumes frees the sessions at once
            self._flush()
            with trio.move_on_after(CLOSE_TIMEOUT):
                if writer is not None and self._connection.resumable:
                    writer.close()  # the goodbye leaves before the stream closes (TLS too)
                    await writer.finished.wait()
                await self._transport.close()
        self._lost("code-mode host connection closed")
        if self._life is not None:
            self._life.deadline = trio.current_time() + CLOSE_TIMEOUT + CLEANUP_GRACE
        with trio.move_on_after(CLOSE_TIMEOUT + CLEANUP_GRACE):
            await self._finished.wait()

    def abort(self, reason: str) -> None:
        """Give up on the host now: everything pending fails with `reason`, it is killed."""
        self._lost(reason)

    def _lost(self, reason: str, cause: BaseException | None = None) -> None:
        """Rule 1: the first failure wins."""
        if self.failure is not None:
            return
        failure = HostLostError(reason)
        failure.__cause__ = cause
        self.failure = failure
        logger.debug("code-mode host connection failed: %s", reason)
        # Answers the host wrote before it went are still its answers (nothing is lost).
        self._orphaned_initials = self._connection.held_initials()
        self._connection.connection_lost()
        self._handshake.set(None)  # wakes a handshake in progress
        self._slots.fail_all(failure)
        self._executes.clear()
        self._cells.close_all()
        self._transport.kill()
        self._ended.set()

    # ---- the wire --------------------------------------------------------------------------

    def _flush(self) -> None:
        if self._stream is not None:
            self._stream.flush()

    def _ping(self) -> bool:
        sent = self._connection.ping()
        self._flush()
        return sent

    def _silent(self, reason: str) -> None:
        # A stopped or wedged host: its socket may stay open (its kernel still answers TCP
        # keepalive), so only its silence tells. Lost: everything pending fails, it is killed.
        self._lost(f"code-mode host stopped answering: {reason}")

    def _pump(self, calls: deque[DelegateCall] | None = None) -> None:
        """Dispatch every event the connection has (also those a call produced locally); the
        reading passes `calls`, where the delegate calls go that it runs next (`_stream.py`)."""
        if self.failure is not None:
            return
        try:
            while (event := self._connection.next_event()) is not NEED_DATA:
                self._dispatch(event, calls)
        except RemoteProtocolError as error:
            self._lost(f"failed to read code-mode host message: {error}", error)
        self._flush()

    def _dispatch(self, event: ClientEvent, calls: deque[DelegateCall] | None) -> None:
        # The events of every cell first, by their exact type (`_ANSWERED`, above).
        if type(event) is _ANSWERED:
            request_id, result = event.request_id, event.result
            context = self._executes.pop(request_id, None)
            if context is not None and type(result) is _OK:
                started = result.value
                assert type(started) is _EXECUTION_STARTED
                wire_id = started.cell_id
                public_id = context.public_id(wire_id)
                self._cells.admit((context.session_id, wire_id), public_id, context.delegate)
            self._slots.deliver_answer(request_id, result)
        elif type(event) is _DELEGATE_REQUESTED:
            if not self._cells.start_call(event, calls):
                # The connection knows the cell and we do not: a bug here, not the host's.
                self._lost(f"code-mode client has no delegate for cell {event.cell_id}")
        elif type(event) is _INITIAL_ANSWERED:
            self._slots.deliver_initial(event.request_id, event.result)
        elif type(event) is _CELL_ENDED:
            self._cells.close((event.session_id, event.cell_id), event.report)
        else:
            self._dispatch_other(event)

    def _dispatch_other(self, event: ClientEvent) -> None:
        match event:
            case DelegateCancelled(call_id=call_id):
                self._cells.cancel_call(call_id)
            case StoredValuesCommitted(session_id=session_id, values=values):
                sink = self._commit_sinks.get(session_id)
                if sink is not None:
                    sink(values)
            case HandshakeCompleted() | HandshakeRejected():
                self._handshake.set(event)
            case ConnectionResumed():
                if self._resumer is not None:
                    self._resumer.answered()
            case ResumeFailed(reason=reason):
                self.resume_failed(reason)
            case GoodbyeReceived():
                self._closing = True  # the host is going on purpose: its end is the end
            case ConnectionEnded():
                pass  # the reader saw EOF: it names the cause once the process exited
