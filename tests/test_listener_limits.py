"""A listener that holds up: the hello deadline, the bound on connections waiting for their
hello, the cap on clients, the descriptor limit (`codemode_host/_listen.py`, rule 5).

Each test starts a real listening host and opens raw TCP connections beside real clients; it
waits for what the host does (an end of file, a log line, an answer), never for time to pass.
"""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

import pytest
import trio
import trio.testing
from codemode_host.engine import open_engine
from codemode_host.server import serve_connection

import codemode
from codemode import HostLostError
from codemode._trio._sockets import parse_address
from codemode.protocol import FrameEncoder, Hello
from tests.delegates import RecordingDelegate
from tests.remote_hosts import RunningHost, listening_host
from tests.sessions import run, texts

pytestmark = pytest.mark.slow


async def _connect(host: RunningHost) -> trio.SocketStream:
    address = parse_address(host.address)
    return await trio.open_tcp_stream(address.host, address.port)


async def _until_closed(stream: trio.SocketStream) -> bytes:
    """Everything the host sends until it closes the connection."""
    received = b""
    while chunk := await stream.receive_some(65536):
        received += chunk
    return received


def _logged(host: RunningHost, text: str) -> None:
    """The host's log holds `text`: it logs each closing before it closes the socket, so this
    holds once the connection's end of file arrived."""
    assert text in host.log(), host.log()


async def _a_cell_runs(host: RunningHost) -> None:
    async with codemode.open_remote_provider([host.address]) as provider:
        session = await provider.create_session()
        assert texts(await run(session, RecordingDelegate(), "text('served')")) == ["served"]


async def test_a_connection_without_a_hello_is_closed_at_its_deadline() -> None:
    with trio.fail_after(30):
        async with listening_host("--hello-timeout", "0.5") as host:
            async with await _connect(host) as silent:
                assert await _until_closed(silent) == b""
            _logged(host, "closed a connection: no hello within 0.5 s")
            await _a_cell_runs(host)  # a client that says hello in time is served
            assert await host.stop() == 0


async def test_silent_connections_past_their_bound_evict_the_oldest() -> None:
    with trio.fail_after(30):
        async with listening_host("--max-waiting-connections", "2") as host:
            async with await _connect(host) as oldest:
                others = [await _connect(host) for _ in range(2)]
                assert await _until_closed(oldest) == b""
            _logged(host, "connections were waiting for their hello")
            # A real client still gets in (it evicts the next oldest silent one), and is
            # served to the end: its hello completed, so it no longer counts as waiting.
            await _a_cell_runs(host)
            for stream in others:
                await stream.aclose()
            assert await host.stop() == 0


async def test_a_client_past_the_cap_is_closed_and_the_others_are_served() -> None:
    with trio.fail_after(30):
        async with listening_host("--max-connections", "1") as host:
            async with codemode.open_remote_provider([host.address]) as first:
                session = await first.create_session()
                delegate = RecordingDelegate()
                assert texts(await run(session, delegate, "store('k', 1); text('in')")) == ["in"]
                async with await _connect(host) as extra:
                    await extra.send_all(
                        FrameEncoder().encode(
                            Hello(supported_versions=[1], codemode_version=version("codemode"))
                        )
                    )
                    await _until_closed(extra)
                _logged(host, "clients are connected (--max-connections)")
                response = await run(session, delegate, "text(String(load('k')))")
                assert texts(response) == ["1"]
            assert await host.stop() == 0


async def test_the_host_takes_its_hard_descriptor_limit() -> None:
    with trio.fail_after(30):
        async with listening_host() as host:
            limits = trio.Path(f"/proc/{host.process.pid}/limits")
            line = next(
                row for row in (await limits.read_text()).splitlines() if "Max open files" in row
            )
            soft, hard = line.split()[3:5]
            assert soft == hard, line
            assert await host.stop() == 0


@pytest.mark.parametrize(
    ("option", "value"),
    [("--hello-timeout", "0"), ("--max-connections", "-1"), ("--max-waiting-connections", "0")],
)
def test_the_bounds_are_positive(option: str, value: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "codemode_host", "--listen", "tcp://127.0.0.1:0", option, value],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert f"{option} must be positive" in result.stderr


def test_the_bounds_need_listen() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "codemode_host", "--max-connections", "3"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 2
    assert "--max-connections only applies with --listen" in result.stderr


async def test_host_lost_names_the_closed_connection() -> None:
    """The client of a connection closed past the cap sees the host as lost (no new wire
    message tells it why: the capability rule)."""
    with trio.fail_after(30):
        async with (
            listening_host("--max-connections", "1") as host,
            codemode.open_remote_provider([host.address]) as first,
        ):
            await (await first.create_session()).cells()
            async with codemode.open_remote_provider([host.address]) as second:
                with pytest.raises(HostLostError):
                    await run(await second.create_session(), RecordingDelegate(), "text(1)")
            assert await host.stop() == 0


async def test_connections_on_a_shared_engine_leave_nothing_on_it() -> None:
    """A listening host's engine outlives its connections: each connection's hooks on it go
    with the connection (one of them kept every connection's call workers alive)."""
    with trio.fail_after(30):
        async with open_engine(workers=1, release_when_idle=True) as engine:
            for _ in range(3):
                client, host = trio.testing.memory_stream_pair()
                hello = Hello(supported_versions=[1], codemode_version=version("codemode"))
                await client.send_all(FrameEncoder().encode(hello))
                await client.aclose()
                await serve_connection(host, host, engine=engine, inventory_signal=False)
                assert engine.release_hooks == 0
