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

import trio
from codemode_host.engine import Engine, open_engine
from codemode_host.runtime import worker_ceiling

from codemode import AdmissionLimits
from codemode._trio import ChunkReader, FrameWriter, Heartbeat
from codemode.protocol import (
    CAPABILITIES,
    HEARTBEAT_CAPABILITY,
    NEED_DATA,
    ApprovalWaiting,
    CancelRequested,
    ConnectionEnded,
    ConnectionState,
    DelegateAnswered,
    HandshakeCompleted,
    HandshakeRejected,
    HostConnection,
    PreemptRequested,
    RemoteProtocolError,
    RequestReceived,
    describe_rejection,
)

from ._requests import Requests

logger = logging.getLogger("codemode.host")

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
) -> int:
    """Serve the protocol on one stream pair until the client goes away; the exit status.

    Args:
        receive: the client's frames.
        send: where the host's frames go.
        parent_pidfd: a pidfd of the client's process: when it dies the host stops serving as
            if the client had closed the stream (design.md, design 3).
        capabilities: what the host offers in the handshake (tests narrow it to play an
            older host).
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
    """
    admission = admission or AdmissionLimits()
    connection = HostConnection(
        supported_capabilities=capabilities,
        admission=admission,
        token=token,
        codemode_version=codemode_version,
    )
    wire = FrameWriter(send, connection.take_outgoing)
    status = 0
    write_failed = False

    def writer_failed(error: BaseException) -> None:
        nonlocal write_failed
        logger.error("failed to write code-mode host message: %s", error)
        write_failed = True
        outer.cancel_scope.cancel()

    if max_workers is None:  # spinning cells up to the cap never starve the others
        max_workers = worker_ceiling(admission)
    engine_scope = (
        open_engine(workers=workers, max_workers=max_workers, release_when_idle=True)
        if engine is None
        else contextlib.nullcontext(engine)
    )
    async with engine_scope as engine, trio.open_nursery() as outer:
        outer.start_soon(wire.run, writer_failed)
        async with trio.open_nursery() as work:
            requests = Requests(engine, connection, work, wire.flush, admission)
            if inventory_signal and threading.current_thread() is threading.main_thread():
                await work.start(_log_inventory_on_signal, requests, connection)
            heartbeat = Heartbeat()

            def ping() -> bool:
                sent = connection.ping()
                wire.flush()
                return sent

            def silent(reason: str) -> None:
                # A stopped client whose socket stays open: served to its end as if it had
                # closed the stream (its sessions shut down).
                logger.warning("closing a connection: the client sent %s", reason)
                reading.cancel()

            def handshake_completed() -> None:
                if HEARTBEAT_CAPABILITY in connection.capabilities:
                    work.start_soon(heartbeat.run, ping, silent)

            with trio.CancelScope() as reading:
                if hello_timeout is not None:
                    reading.deadline = trio.current_time() + hello_timeout
                if parent_pidfd is not None:
                    work.start_soon(_watch_parent, parent_pidfd, reading)
                if stop is not None:
                    work.start_soon(_stop_reading, stop, reading)
                status = await _read(
                    receive,
                    connection,
                    requests,
                    wire,
                    reading,
                    on_ready,
                    heartbeat,
                    handshake_completed,
                )
                reading.cancel()
            if (
                reading.cancelled_caught
                and connection.state is ConnectionState.HANDSHAKING
                and hello_timeout is not None
                and trio.current_time() >= reading.deadline
            ):
                logger.warning("closed a connection: no hello within %g s", hello_timeout)
                status = 1
            requests.disconnect()
            with trio.move_on_after(SHUTDOWN_TIMEOUT) as bounded:
                await requests.shutdown()
            if bounded.cancelled_caught:
                logger.error("timed out shutting down code-mode host state")
                status = 1
            work.cancel_scope.cancel()
        wire.close()
        outer.cancel_scope.deadline = trio.current_time() + SHUTDOWN_TIMEOUT
    return 1 if write_failed else status


async def _read(
    receive: trio.abc.ReceiveStream,
    connection: HostConnection,
    requests: Requests,
    wire: FrameWriter,
    reading: trio.CancelScope,
    on_ready: Callable[[], bool] | None,
    heartbeat: Heartbeat,
    handshake_completed: Callable[[], None],
) -> int:
    """Feed the connection and dispatch its events until the client is gone; the status."""
    reader = ChunkReader(receive, READ_CHUNK)
    try:
        while True:
            event = connection.next_event()
            if event is NEED_DATA:
                wire.flush()
                data = await reader.receive_some()
                heartbeat.heard()
                connection.receive_data(data)
                continue
            match event:
                case RequestReceived(request_id=request_id, request=request):
                    requests.start(request_id, request)
                case CancelRequested(request_id=request_id):
                    requests.cancel(request_id)
                case PreemptRequested(request_id=request_id):
                    requests.preempt(request_id)
                case DelegateAnswered(call_id=call_id, result=result):
                    requests.answered(call_id, result)
                case ApprovalWaiting(call_id=call_id, waiting=waiting):
                    requests.approval_waiting(call_id, waiting)
                case HandshakeCompleted():
                    reading.deadline = math.inf  # the hello deadline is met
                    if on_ready is not None and not on_ready():
                        return 1
                    handshake_completed()
                case HandshakeRejected(reason=reason):
                    logger.warning("refused a client: %s", describe_rejection(reason))
                    return 0
                case ConnectionEnded():
                    return 0
    except RemoteProtocolError as error:
        logger.error("%s", error)
    except trio.BrokenResourceError as error:
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
