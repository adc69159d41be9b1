"""In-memory hosts for the process provider: its real client over trio memory streams.

`memory_hosts(monkeypatch, *scripts)` makes every host the process provider spawns in the
block a `MemoryHost`, a `HostTransport` whose streams are trio memory streams to a scripted
host: a task that speaks the protocol through a real `codemode.protocol.HostConnection` (or
writes whatever bytes a script wants). The n-th host spawned runs `scripts[n]`, later ones
`serve` (a host that answers every request), as `tests/fake_host.py` lets its first start
misbehave and execs the real host after. Nothing is a subprocess and nothing runs the engine,
so the client's timeouts (the handshake, the close of a host, the provider's shutdown) run on
pytest-trio's `autojump_clock` and take no real time:

    async def test_x(autojump_clock: trio.testing.MockClock, monkeypatch: ...) -> None:
        async with memory_hosts(monkeypatch, silent) as hosts:
            async with codemode.open_process_provider(handshake_timeout=3) as provider:
                ...
        assert hosts.spawned[0].status == KILLED

What the transport mirrors of a spawned host (`codemode.process._host_process.SpawnedHost`):
a host has an exit status once its script returned (`KILLED` once killed); its end of the
streams closes when it exits, so the client reads EOF and a write to it fails as on a broken
pipe; `close` closes its input and waits for it to exit; `kill` cancels its script; `reap`
kills it if it runs and waits for it. The seam is the one place the process provider makes
a transport from a host command (`SpawnedHost` in `codemode.process._provider`), replaced for
the block with `monkeypatch`.
"""

from __future__ import annotations

import itertools
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from codemode import (
    Completed,
    InputText,
    LiveCell,
    MissingCell,
    SessionUsage,
    Terminated,
    WaitOutcome,
    Yielded,
)
from codemode._wire._transport import DRAIN_TIMEOUT, HostTransport
from codemode.process import _provider
from codemode.protocol import (
    CAPABILITIES,
    HEARTBEAT_CAPABILITY,
    NEED_DATA,
    CellList,
    ConnectionEnded,
    Err,
    ErrorKind,
    Execute,
    ExecuteToPending,
    ExecutionStarted,
    GetUsage,
    HandshakeRejected,
    HostConnection,
    HostRequest,
    HostResponse,
    ListCells,
    Ok,
    OpenSession,
    RemoteProtocolError,
    RequestReceived,
    SessionClosed,
    SessionReady,
    ShutdownSession,
    Terminate,
    UsageReport,
    Wait,
    WaitCompleted,
    WaitToPending,
)

KILLED = -signal.SIGKILL
"""The exit status of a killed host (a killed process's `returncode`)."""

HALF_FRAME = (44).to_bytes(4, "little") + b"\x83\xa4type\xb0connection/ready"
"""The first 22 bytes of a frame that declares 44 (as `tests/fake_host.py` writes)."""

FIRST_PID = 4_000_000
"""Pids the memory hosts report (above any real one: `/proc/sys/kernel/pid_max` is at most
2^22), so that a statistic that names one cannot be mistaken for a process."""

Script = Callable[["ScriptedHost"], Awaitable[int]]
"""What a host does from its start; returns its exit status."""


def never(request: HostRequest) -> bool:
    return False


def echo(cell_id: str, request: Execute) -> Completed | Yielded:
    """A cell that completes at once, its output its source."""
    return Completed(cell_id=cell_id, content_items=[InputText(text=request.request.source)])


def runs_forever(cell_id: str, request: Execute) -> Completed | Yielded:
    """A cell that yields at once and runs until it is terminated or its session shuts down."""
    return Yielded(cell_id=cell_id, content_items=[])


class ScriptedHost:
    """The far end of one memory host: its streams, its protocol connection, what it received.

    A script drives it with `receive`, `send`, `close_output`, `read_until_eof` (raw bytes),
    or `serve` / `serve_until` (the protocol, through `connection`).
    """

    def __init__(self, index: int, *, heartbeat: bool = True) -> None:
        self.index = index
        self.pid = FIRST_PID + index
        offered = [name for name in CAPABILITIES if heartbeat or name != HEARTBEAT_CAPABILITY]
        self.connection = HostConnection(supported_capabilities=offered)
        self.requests: list[HostRequest] = []
        """Every request received, in order (held ones too)."""
        self.held: list[tuple[int, HostRequest]] = []
        """Requests the script chose never to answer."""
        self.status: int | None = None
        """The exit status once the host ended (`KILLED` if it was killed)."""
        self.exited = trio.Event()
        self.input_closed = trio.Event()
        """Set once the host read the end of its input (the client closed its stdin)."""
        self.input_closed_at: float | None = None
        self.exited_at: float | None = None
        """When (`trio.current_time()`) each happened."""
        self._open_cells: dict[str, set[str]] = {}
        self._cell_ids = itertools.count(1)
        self._scope = trio.CancelScope()
        self.client_send, self._input = trio.testing.memory_stream_one_way_pair()
        self._output, self.client_receive = trio.testing.memory_stream_one_way_pair()

    # ---- the process -------------------------------------------------------------------------

    async def run(self, script: Script) -> None:
        """Run `script` until it returns (its status) or the host is killed."""
        status = KILLED
        try:
            with self._scope:
                status = await script(self)
        finally:
            self.status = status
            self.exited_at = trio.current_time()
            # A process that ends closes its pipes: the client reads EOF, its writes fail.
            await trio.aclose_forcefully(self._output)
            await trio.aclose_forcefully(self._input)
            self.exited.set()

    def kill(self) -> None:
        self._scope.cancel()

    # ---- raw bytes ---------------------------------------------------------------------------

    async def receive(self) -> bytes:
        """The next bytes the client wrote (b"" at the end of the input)."""
        data = await self._input.receive_some()
        if not data and not self.input_closed.is_set():
            self.input_closed_at = trio.current_time()
            self.input_closed.set()
        return bytes(data)

    async def send(self, data: bytes) -> None:
        await self._output.send_all(data)

    async def close_output(self) -> None:
        await self._output.aclose()

    async def read_until_eof(self) -> None:
        while await self.receive():
            pass

    async def read_frame(self) -> bytes | None:
        """At least the first frame the client wrote (None: the input ended first)."""
        data = b""
        while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "little"):
            chunk = await self.receive()
            if not chunk:
                return None
            data += chunk
        return data

    # ---- the protocol ------------------------------------------------------------------------

    async def serve(
        self,
        *,
        hold: Callable[[HostRequest], bool] = never,
        initial: Callable[[str, Execute], Completed | Yielded] = echo,
    ) -> int:
        """Answer the handshake and every request (but those `hold` picks) until the input
        ends; 0 then, 1 if the client broke the protocol (as the real host exits)."""
        try:
            await self.serve_until(never, hold=hold, initial=initial)
        except RemoteProtocolError:
            return 1
        return 0

    async def serve_until(
        self,
        stop: Callable[[HostRequest], bool],
        *,
        hold: Callable[[HostRequest], bool] = never,
        initial: Callable[[str, Execute], Completed | Yielded] = echo,
    ) -> tuple[int, HostRequest] | None:
        """As `serve`, until a request `stop` picks arrives: that one is returned unanswered,
        with its id (None: the input ended first, or the handshake was refused).

        Executes start cell `1`, `2`, ... of their session; `initial` gives a cell's initial
        response, and a `Yielded` cell stays open until it is terminated or its session shuts
        down. Requests `hold` picks are kept in `held`, never answered.
        """
        while True:
            data = await self.receive()
            self.connection.receive_data(data)
            while (event := self.connection.next_event()) is not NEED_DATA:
                if isinstance(event, ConnectionEnded | HandshakeRejected):
                    await self.flush()
                    return None
                if not isinstance(event, RequestReceived):
                    continue  # cancels, preemptions and delegate answers: nothing to do
                request = event.request
                self.requests.append(request)
                if stop(request):
                    await self.flush()
                    return event.request_id, request
                if hold(request):
                    self.held.append((event.request_id, request))
                else:
                    self._answer(event.request_id, request, initial)
            await self.flush()

    async def flush(self) -> None:
        data = self.connection.data_to_send()
        if data:
            await self.send(data)

    def _answer(
        self,
        request_id: int,
        request: HostRequest,
        initial: Callable[[str, Execute], Completed | Yielded],
    ) -> None:
        session_id = request.session_id
        cells = self._open_cells.setdefault(session_id, set())
        result: Ok[HostResponse] | Err
        match request:
            case OpenSession():
                result = Ok(value=SessionReady(session_id=session_id))
            case ExecuteToPending():
                result = Err(kind=ErrorKind.INVALID_REQUEST, message="not scripted")
            case Execute():
                cell_id = str(next(self._cell_ids))
                self.connection.respond(request_id, Ok(value=ExecutionStarted(cell_id=cell_id)))
                response = initial(cell_id, request)
                self.connection.respond_initial(request_id, Ok(value=response))
                if isinstance(response, Yielded):
                    cells.add(cell_id)
                else:
                    self.connection.cell_closed(session_id, cell_id)
                return
            case Wait(request=wait):
                outcome: WaitOutcome = _missing(wait.cell_id)
                if wait.cell_id in cells:
                    outcome = LiveCell(response=Yielded(cell_id=wait.cell_id, content_items=[]))
                result = Ok(value=WaitCompleted(outcome=outcome))
            case Terminate(cell_id=cell_id):
                outcome = _missing(cell_id)
                if cell_id in cells:
                    cells.discard(cell_id)
                    self.connection.cell_closed(session_id, cell_id)
                    outcome = LiveCell(response=Terminated(cell_id=cell_id, content_items=[]))
                result = Ok(value=WaitCompleted(outcome=outcome))
            case ShutdownSession():
                for cell_id in sorted(cells):
                    self.connection.cell_closed(session_id, cell_id)
                cells.clear()
                result = Ok(value=SessionClosed(session_id=session_id))
            case ListCells():
                result = Ok(value=CellList(cells=[]))
            case GetUsage():
                result = Ok(value=UsageReport(usage=SessionUsage(tool_calls=0, cpu_time_ms=0.0)))
            case WaitToPending():
                result = Err(kind=ErrorKind.INVALID_REQUEST, message="not scripted")
        self.connection.respond(request_id, result)


def _missing(cell_id: str) -> MissingCell:
    return MissingCell(response=Completed(cell_id=cell_id, content_items=[]))


# ---- scripts -----------------------------------------------------------------------------------


async def serve(host: ScriptedHost) -> int:
    """A host that answers every request (cells complete at once, echoing their source)."""
    return await host.serve()


async def silent(host: ScriptedHost) -> int:
    """A host that never reads nor writes a byte (it sleeps until it is killed)."""
    await trio.sleep_forever()
    raise AssertionError("unreachable")


def exits(status: int) -> Script:
    """A host that exits with `status` once the hello reached it. (A real host that exits at
    once finds the hello in its pipe's buffer already: the client writes it while the process
    starts. One that exited before the write would fail it: `failed to write`.)"""

    async def script(host: ScriptedHost) -> int:
        await host.read_frame()
        return status

    return script


def writes(data: bytes) -> Script:
    """A host that reads the hello, writes `data`, closes its output, then reads its input
    until it ends (as `tests/fake_host.py garbage`)."""

    async def script(host: ScriptedHost) -> int:
        await host.read_frame()
        await host.send(data)
        await host.close_output()
        await host.read_until_eof()
        return 0

    return script


async def half_ready(host: ScriptedHost) -> int:
    """A host that reads the hello, writes half of its answer, then reads until its input
    ends (a handshake that stalls)."""
    await host.read_frame()
    await host.send(HALF_FRAME)
    await host.read_until_eof()
    return 0


async def stuck_in_shutdown(host: ScriptedHost) -> int:
    """A host whose cells run until stopped and that never answers a session's shutdown."""
    return await host.serve(
        hold=lambda request: isinstance(request, ShutdownSession), initial=runs_forever
    )


async def deaf_to_eof(host: ScriptedHost) -> int:
    """A host that serves, but does not exit once its input ended (killed after the
    client's close timeout)."""
    await host.serve()
    await trio.sleep_forever()
    raise AssertionError("unreachable")


async def stalls_mid_frame(host: ScriptedHost) -> int:
    """A host that serves until the first execute, starts its cell `1`, then writes half of
    a frame and nothing more (it reads until its input ends)."""
    stopped = await host.serve_until(lambda request: isinstance(request, Execute))
    assert stopped is not None
    request_id, _ = stopped
    host.connection.respond(request_id, Ok(value=ExecutionStarted(cell_id="1")))
    await host.flush()
    await host.send(HALF_FRAME)
    await host.read_until_eof()
    return 0


# ---- the transport -----------------------------------------------------------------------------


class MemoryHosts:
    """The memory hosts spawned in a `memory_hosts` block, in order."""

    def __init__(self, nursery: trio.Nursery, scripts: Sequence[Script], heartbeat: bool) -> None:
        self._nursery = nursery
        self._scripts = list(scripts)
        self._heartbeat = heartbeat
        self.spawned: list[ScriptedHost] = []

    def spawn(self) -> ScriptedHost:
        index = len(self.spawned)
        host = ScriptedHost(index, heartbeat=self._heartbeat)
        self.spawned.append(host)
        script = self._scripts[index] if index < len(self._scripts) else serve
        self._nursery.start_soon(host.run, script, name=f"memory host {index}")
        return host


class MemoryHost(HostTransport):
    """A `HostTransport` to a scripted host in memory (the process provider's spawned host
    replaced: `memory_hosts`)."""

    hosts: MemoryHosts | None = None
    """Where `open` spawns (set by `memory_hosts` for its block)."""

    def __init__(self, command: Sequence[str]) -> None:
        self.command = list(command)
        self.host: ScriptedHost | None = None

    @property
    def pid(self) -> int | None:
        return None if self.host is None else self.host.pid

    async def open(self) -> tuple[trio.abc.SendStream, trio.abc.ReceiveStream]:
        assert self.hosts is not None, "a MemoryHost outside a memory_hosts block"
        self.host = host = self.hosts.spawn()
        await trio.lowlevel.checkpoint()
        return host.client_send, host.client_receive

    def start(
        self, nursery: trio.Nursery, lost: Callable[[str], None], read_done: trio.Event
    ) -> None:
        nursery.start_soon(self._supervise, lost, read_done)

    async def _supervise(self, lost: Callable[[str], None], read_done: trio.Event) -> None:
        host = self._host()
        await host.exited.wait()
        with trio.move_on_after(DRAIN_TIMEOUT):
            await read_done.wait()
        lost(f"code-mode host exited with status {host.status}")

    def _host(self) -> ScriptedHost:
        assert self.host is not None
        return self.host

    def exit_status(self) -> int | None:
        return None if self.host is None else self.host.status

    def kill(self) -> None:
        if self.host is not None:
            self.host.kill()

    async def close(self) -> None:
        host = self._host()
        await host.client_send.aclose()
        await host.exited.wait()

    async def ended(self) -> str:
        host = self._host()
        with trio.move_on_after(DRAIN_TIMEOUT):
            await host.exited.wait()
            return f"code-mode host exited with status {host.status}"
        return self.closed_text

    async def reap(self) -> None:
        host = self.host
        if host is None:
            return
        host.kill()
        await trio.aclose_forcefully(host.client_send)
        await trio.aclose_forcefully(host.client_receive)
        await host.exited.wait()


@asynccontextmanager
async def memory_hosts(
    monkeypatch: pytest.MonkeyPatch, *scripts: Script, heartbeat: bool = True
) -> AsyncIterator[MemoryHosts]:
    """For the block, every host the process provider spawns is a memory host: the n-th runs
    `scripts[n]`, later ones `serve`. With `heartbeat`, the hosts offer that capability, as
    the real one does (the client then pings a silent host and gives it up after a few
    intervals: `codemode._trio.Heartbeat`); without it they are older hosts, so that a test of
    another timeout sees that one alone. Leaving the block kills the hosts still running."""
    async with trio.open_nursery() as nursery:
        hosts = MemoryHosts(nursery, scripts, heartbeat)

        class Spawned(MemoryHost):
            pass

        Spawned.hosts = hosts
        with monkeypatch.context() as patch:
            patch.setattr(_provider, "SpawnedHost", Spawned)
            try:
                yield hosts
            finally:
                for host in hosts.spawned:
                    host.kill()
