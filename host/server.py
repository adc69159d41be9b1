"""The host's trio adapter: bytes to the sans-IO `HostConnection`, its events to the runtime.

`serve_connection(receive, send)` serves one client until it goes away and returns the exit
status. The protocol's rules (handshake, ids, per-cell order, frame limits) live in the
connection; this module only moves bytes and runs tasks:

- the reader feeds bytes to the connection and dispatches its events: each request runs as a
  task (`_requests.Requests`), `operation/cancel` cancels one, answers to reverse calls land in
  their slots;
- the writer (`FrameWriter`) sends whatever the connection queued when the scheduler's pass
  ends, in one write (the rest, if the pipe is full, through its task);
- when the client goes away (EOF, a protocol error, its process died), pending reverse calls
  fail, active requests are cancelled, every session is shut down (bounded by 5 s) and what is
  queued is flushed (bounded by 5 s).

Admission (`AdmissionLimits`): the connection bounds the requests in flight, the runtime's
`Admission` the active cells and pending reverse calls; the engine may grow to at least as many
workers as there are active-cell slots. On SIGUSR1 (when serving from the main thread) the
host logs its inventory: every session, every live cell, and the slots in use.

Exit status: 0 when the client closed the connection (or was refused at the handshake), 1 when
it broke the protocol, the stream broke, or the shutdown timed out.
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import threading
from collections.abc import Callable, Iterable
from functools import partial
from typing import Final

import trio
from codemode_host.engine import Engine, open_engine
from codemode_host.runtime import worker_ceiling

from codemode import AdmissionLimits
from codemode._trio import ChunkReader, FrameWriter, Heartbeat
from codemode.protocol import (
    CAPABILITIES,
    HEARTBEAT_CAPABILITY,
    NEED_DATA,
    RESUME_CAPABILITY,
    ApprovalWaiting,
    CancelRequested,
    ConnectionEnded,
    ConnectionState,
    DelegateAnswered,
    GoodbyeReceived,
    HandshakeCompleted,
    HandshakeRejected,
    HostConnection,
    PreemptRequested,
    RemoteProtocolError,
    RequestReceived,
    ResumeRequested,
    describe_rejection,
)

from ._requests import Requests
from ._resume import Handover, ResumeDesk, ResumeSlot

logger = logging.getLogger("codemode.host")

# The connection's events of every cell, compared with an event's exact class (the connection
# makes no other; C statics compiled): a failed `isinstance` against a msgspec class costs about
# 600 instructions compiled, three a delegate answer in a `match`.
_REQUEST_RECEIVED: Final = RequestReceived
_DELEGATE_ANSWERED: Final = DelegateAnswered

SHUTDOWN_TIMEOUT = 5.0
READ_CHUNK = 1 << 20


async def serve_connection(
    receive: trio.abc.ReceiveStream,
    send: trio.abc.SendStream,
    *,
    parent_pidfd: int | None = None,
    capabilities: Iterable[str] = CAPABILITIES,
    admission: AdmissionLimits | None = None,
    workers: int | None = None,
    max_workers: int | None = None,
    engine: Engine | None = None,
    token: str | None = None,
    codemode_version: str | None = None,
    stop: trio.Event | None = None,
    inventory_signal: bool = True,
    hello_timeout: float | None = None,
    on_ready: Callable[[], bool] | None = None,
    resumes: ResumeDesk | None = None,
    on_handed_over: Callable[[], None] | None = None,
) -> int:
    """Serve the protocol on one stream pair until the client goes away; the exit status.

    Args:
        receive: the client's frames.
        send: where the host's frames go.
        parent_pidfd: a pidfd of the client's process: when it dies the host stops serving as
            if the client had closed the stream (design.md, design 3).
        capabilities: what the host offers in the handshake (tests narrow it to play an
            older host). Resume is offered only with `resumes`.
        admission: the limits of this connection (default `AdmissionLimits()`), advertised
            in the handshake.
        workers: native engine worker threads to start with (None: one per core).
        max_workers: the most engine worker threads the pool grows to (None: the engine's
            default, or the active-cell cap if higher).
        engine: an engine shared with other connections (a listening host's; `workers` and
            `max_workers` are then ignored). None: the connection starts its own.
        token: the shared secret the client's hello must carry (None: none).
        codemode_version: the version the client's hello must name (None: not checked).
        stop: once set, the host stops serving as if the client had closed the stream.
        inventory_signal: log the inventory on SIGUSR1 (from the main thread only).
        hello_timeout: seconds the client has to complete its hello, else the connection is
            closed with a logged reason (None: no deadline, as on a host's own pipes).
        on_ready: called when the handshake completed; False closes the connection (the
            listener's cap on clients, which logs why).
        resumes: the listener's desk of resumable connections: this connection offers resume,
            survives a cut stream for the desk's grace, and a stream that asks to resume
            another connection is handed over to it (`_resume.py`).
        on_handed_over: called when this stream was handed over to the connection it resumes.
    """
    admission = admission or AdmissionLimits()
    offered = frozenset(capabilities)
    if resumes is None:
        offered -= {RESUME_CAPABILITY}
    connection = HostConnection(
        supported_capabilities=offered,
        admission=admission,
        token=token,
        codemode_version=codemode_version,
        resume_grace=resumes.grace if resumes is not None else 0.0,
    )
    if max_workers is None:  # spinning cells up to the cap never starve the others
        max_workers = worker_ceiling(admission)
    engine_scope = (
        open_engine(workers=workers, max_workers=max_workers, release_when_idle=True)
        if engine is None
        else contextlib.nullcontext(engine)
    )
    async with engine_scope as engine, trio.open_nursery() as outer:
        served = _Streams(connection, outer)
        status: int | None = 0
        async with trio.open_nursery() as work:
            requests = Requests(engine, connection, work, served.flush, admission)
            if inventory_signal and threading.current_thread() is threading.main_thread():
                await work.start(_log_inventory_on_signal, requests, connection)
            hooks = _Hooks(requests, work, on_ready, resumes, on_handed_over, served)
            with trio.CancelScope() as ending:
                if parent_pidfd is not None:
                    work.start_soon(_watch_parent, parent_pidfd, ending)
                if stop is not None:
                    work.start_soon(_stop_reading, stop, ending)
                status = await served.serve(receive, send, hello_timeout, hooks)
                while status is None:  # cut, resumable: wait for the client's next stream
                    status = await _resume(connection, served, hooks)
            if ending.cancelled_caught:  # the host stops: the client must not try to resume
                connection.goodbye()
                served.flush()
            if resumes is not None:
                resumes.forget(connection.resume_token)
            hooks.slot.close()
            requests.disconnect()
            with trio.move_on_after(SHUTDOWN_TIMEOUT) as bounded:
                await requests.shutdown()
            if bounded.cancelled_caught:
                logger.error("timed out shutting down code-mode host state")
                status = 1
            work.cancel_scope.cancel()
        served.close()
        outer.cancel_scope.deadline = trio.current_time() + SHUTDOWN_TIMEOUT
    return 1 if served.write_failed else status or 0


async def _resume(connection: HostConnection, served: _Streams, hooks: _Hooks) -> int | None:
    """The client's stream was cut: keep everything for the grace and serve the stream it
    resumes on; the status once it ended for good (None: cut again)."""
    assert hooks.resumes is not None
    grace = hooks.resumes.grace
    connection.suspend()
    handover = await hooks.slot.wait(trio.current_time() + grace)
    if handover is None:
        logger.warning(
            "a client did not resume its cut connection within %g s: freeing its sessions", grace
        )
        return 0
    if not connection.resume(handover.received):
        handover.answer.set(False)
        logger.warning("refused a resume: the client's frame count does not match")
        return 1
    assert connection.resume_token is not None
    hooks.resumes.register(connection.resume_token, hooks.slot)
    handover.answer.set(True)
    logger.info("a client resumed its connection")
    try:
        return await served.serve(handover.receive, handover.send, None, hooks)
    finally:
        handover.done.set()


async def _hand_over(
    receive: trio.abc.ReceiveStream,
    send: trio.abc.SendStream,
    connection: HostConnection,
    event: ResumeRequested,
    hooks: _Hooks,
) -> int:
    """This new stream asks to resume another connection: hand it over through the desk
    and wait while that connection uses it, or refuse (the token is unknown or spent)."""
    handover = Handover(event.received, receive, send)
    if hooks.resumes is not None and await hooks.resumes.hand_over(event.token, handover):
        if hooks.on_handed_over is not None:
            hooks.on_handed_over()
        await handover.done.wait()
        return 0
    connection.refuse_resume("unknown or spent resume token (its grace may have ended)")
    hooks.served.flush()
    logger.warning("refused a resume: unknown or spent resume token")
    return 0


class _Hooks:
    """What reading a stream calls back into: the requests, the listener's hooks, the
    connection's place at the resume desk."""

    def __init__(
        self,
        requests: Requests,
        work: trio.Nursery,
        on_ready: Callable[[], bool] | None,
        resumes: ResumeDesk | None,
        on_handed_over: Callable[[], None] | None,
        served: _Streams,
    ) -> None:
        self.requests = requests
        self.work = work
        self.on_ready = on_ready
        self.resumes = resumes
        self.on_handed_over = on_handed_over
        self.served = served
        self.slot = ResumeSlot(served.cut)
        self.goodbye = False
        """The client said goodbye: the end of its stream ends the connection."""


class _Streams:
    """The stream a connection is on, one after another when a resumable one is cut: its
    writer, its heartbeat, its reader (`serve`), and letting go of it (`cut`)."""

    def __init__(self, connection: HostConnection, nursery: trio.Nursery) -> None:
        self._connection = connection
        self._nursery = nursery
        self._writer: FrameWriter | None = None
        self._reading: trio.CancelScope | None = None
        self._cut = False
        self.write_failed = False

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def cut(self) -> None:
        """Let go of the current stream (rule 2 of `_resume.py`), if there is one."""
        if self._reading is not None:
            self._cut = True
            self._reading.cancel()

    def close(self) -> None:
        """The connection is over: write what is left, then the writer ends."""
        if self._writer is not None:
            self._writer.close()

    async def serve(
        self,
        receive: trio.abc.ReceiveStream,
        send: trio.abc.SendStream,
        hello_timeout: float | None,
        hooks: _Hooks,
    ) -> int | None:
        """Serve one stream: the exit status once the client is gone for good, or None
        when a resumable connection's stream was cut (it is closed then)."""
        connection = self._connection
        writer = self._writer = FrameWriter(send, connection.take_outgoing)
        self._cut = False
        self._nursery.start_soon(writer.run, partial(self._write_failed, writer))
        status: int | None = None
        with trio.CancelScope() as reading:
            self._reading = reading
            if hello_timeout is not None:
                reading.deadline = trio.current_time() + hello_timeout
            heartbeat = Heartbeat()
            if connection.state is ConnectionState.OPEN:  # a resumed stream
                self.start_heartbeat(hooks, heartbeat)
            status = await _read(receive, send, connection, reading, heartbeat, hooks)
        self._reading = None
        if (
            reading.cancelled_caught
            and connection.state is ConnectionState.HANDSHAKING
            and hello_timeout is not None
            and trio.current_time() >= reading.deadline
        ):
            logger.warning("closed a connection: no hello within %g s", hello_timeout)
            return 1
        if not (connection.resumable and not hooks.goodbye and (status is None or self._cut)):
            return 0 if status is None else status
        writer.abandon()  # the cut: what it held is in the replay book
        self._writer = None
        with trio.CancelScope(shield=True):  # bounded: a forceful close does not wait
            await trio.aclose_forcefully(send)
            await trio.aclose_forcefully(receive)
        return None

    def _write_failed(self, writer: FrameWriter, error: BaseException) -> None:
        if writer is not self._writer:
            return  # a stream let go of already
        if self._connection.resumable and self._reading is not None:
            logger.info("a client's stream broke while writing: %s", error)
            self.cut()
            return
        logger.error("failed to write code-mode host message: %s", error)
        self.write_failed = True
        self._nursery.cancel_scope.cancel()

    def start_heartbeat(self, hooks: _Hooks, heartbeat: Heartbeat) -> None:
        """Watch this stream's client (with the heartbeat capability); ends with the stream."""
        if HEARTBEAT_CAPABILITY not in self._connection.capabilities:
            return
        reading = self._reading
        connection = self._connection

        def ping() -> bool:
            if self._reading is not reading:
                return False  # the stream was let go of: this heartbeat ends
            sent = connection.ping()
            self.flush()
            return sent

        def silent(reason: str) -> None:
            if self._reading is reading:
                # A stopped client whose socket stays open: a cut when resumable, else served
                # to its end as if it had closed the stream (its sessions shut down).
                logger.warning("closing a connection: the client sent %s", reason)
                self.cut()

        hooks.work.start_soon(heartbeat.run, ping, silent)


async def _read(
    receive: trio.abc.ReceiveStream,
    send: trio.abc.SendStream,
    connection: HostConnection,
    reading: trio.CancelScope,
    heartbeat: Heartbeat,
    hooks: _Hooks,
) -> int | None:
    """Feed the connection and dispatch its events until the client is gone; the status
    (None: the stream ended or broke, and the connection is resumable)."""
    reader = ChunkReader(receive, READ_CHUNK)
    requests = hooks.requests
    served = hooks.served
    try:
        while True:
            event = connection.next_event()
            if event is NEED_DATA:
                served.flush()
                data = await reader.receive_some()
                heartbeat.heard()
                if not data and connection.resumable:
                    return None
                connection.receive_data(data)
                continue
            # The two events of every cell by their exact class (`_REQUEST_RECEIVED`).
            if type(event) is _REQUEST_RECEIVED:
                requests.start(event.request_id, event.request)
                continue
            if type(event) is _DELEGATE_ANSWERED:
                requests.answered(event.call_id, event.result)
                continue
            match event:
                case CancelRequested(request_id=request_id):
                    requests.cancel(request_id)
                case PreemptRequested(request_id=request_id):
                    requests.preempt(request_id)
                case ApprovalWaiting(call_id=call_id, waiting=waiting):
                    requests.approval_waiting(call_id, waiting)
                case HandshakeCompleted():
                    reading.deadline = math.inf  # the hello deadline is met
                    if hooks.on_ready is not None and not hooks.on_ready():
                        return 1
                    if hooks.resumes is not None and connection.resume_token is not None:
                        hooks.resumes.register(connection.resume_token, hooks.slot)
                    served.start_heartbeat(hooks, heartbeat)
                case ResumeRequested():
                    reading.deadline = math.inf
                    return await _hand_over(receive, send, connection, event, hooks)
                case GoodbyeReceived():
                    hooks.goodbye = True
                case HandshakeRejected(reason=reason):
                    logger.warning("refused a client: %s", describe_rejection(reason))
                    return 0
                case ConnectionEnded():
                    return 0
    except RemoteProtocolError as broken:
        logger.error("%s", broken)
    except trio.BrokenResourceError as error:
        if connection.resumable and not hooks.goodbye:
            logger.info("a client's stream broke: %s", error)
            return None
        logger.error("failed to read code-mode client message: %s", error)
    except trio.Cancelled:
        raise
    return 1


async def _log_inventory_on_signal(
    requests: Requests,
    connection: HostConnection,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    with trio.open_signal_receiver(signal.SIGUSR1) as signals:
        task_status.started()
        async for _ in signals:
            _log_inventory(requests, connection)


def _log_inventory(requests: Requests, connection: HostConnection) -> None:
    # At WARNING: the operator asked for it, and the host's default log level is WARNING.
    limits = requests.admission.limits
    inventory = requests.inventory()
    lines = [
        f"inventory: {len(inventory)} sessions;"
        f" active cells {requests.admission.active_cells}/{limits.max_active_cells};"
        f" pending delegate calls {requests.admission.pending_calls}"
        f"/{limits.max_pending_delegate_calls};"
        f" requests in flight {connection.statistics().requests}"
        f"/{limits.max_requests_in_flight}"
    ]
    for session_id, cells in inventory.items():
        lines.append(f"  session {session_id}: {len(cells)} cells")
        lines.extend(
            f"    cell {cell.cell_id}: phase={cell.phase!r} age_s={cell.age_s:.3f}"
            f" pending_tool_calls={cell.pending_tool_calls}"
            f" buffered_output_bytes={cell.buffered_output_bytes}"
            f" cpu_time_ms={cell.cpu_time_ms:.1f}"
            for cell in cells
        )
    logger.warning("%s", "\n".join(lines))


async def _stop_reading(stop: trio.Event, reading: trio.CancelScope) -> None:
    await stop.wait()
    reading.cancel()


async def _watch_parent(pidfd: int, reading: trio.CancelScope) -> None:
    await trio.lowlevel.wait_readable(pidfd)
    logger.warning("the code-mode client process exited; shutting down")
    reading.cancel()
