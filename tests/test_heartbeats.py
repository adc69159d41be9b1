"""Heartbeats: a peer that stops answering is noticed even when its socket stays open.

A SIGSTOPped host still has its pipes and its sockets (its kernel even answers TCP keepalive),
so without heartbeats a request to it waited forever. Both ends now ping a silent peer and
declare it lost after a few silent intervals (`codemode/_trio/_heartbeat.py`). The tests
shorten the client's interval; the host's own stays at its default.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from importlib.metadata import version
from pathlib import Path

import pytest
import trio
from codemode_host.server import serve_connection

import codemode
from codemode import HostLostError, Provider
from codemode._trio import _heartbeat
from codemode.protocol import (
    HEARTBEAT_CAPABILITY,
    FrameDecoder,
    FrameEncoder,
    Hello,
    HostMessage,
    Ping,
    Pong,
    Ready,
)
from tests.delegates import RecordingDelegate
from tests.frames import receive_message
from tests.remote_hosts import listening_host
from tests.sessions import run, texts

pytestmark = pytest.mark.slow


@pytest.fixture
def short_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_heartbeat, "HEARTBEAT_INTERVAL", 0.1)


@contextmanager
def stopped(pid: int) -> Iterator[None]:
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        # A host declared lost is killed and may be reaped already (soonest on a loaded
        # machine): nothing is left to continue.
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


async def _loses_a_stopped_host(provider: Provider, pid: int) -> None:
    session = await provider.create_session()
    delegate = RecordingDelegate()
    assert texts(await run(session, delegate, "text('before')")) == ["before"]
    lost = "code-mode host stopped answering: nothing received for 4 heartbeat intervals of 0.1 s"
    with stopped(pid), pytest.raises(HostLostError, match=re.escape(lost)):
        await run(session, delegate, "text('during')")


async def test_a_stopped_spawned_host_is_lost(short_heartbeat: None) -> None:
    with trio.fail_after(30):
        async with codemode.open_process_provider() as provider:
            await provider.create_session()  # spawns the host
            (host,) = provider.statistics().hosts
            assert host.pid is not None
            await _loses_a_stopped_host(provider, host.pid)
            # The provider moves on: a new host, the next generation.
            session = await provider.create_session()
            assert texts(await run(session, RecordingDelegate(), "text('after')")) == ["after"]


@pytest.mark.parametrize("listen", ["tcp://127.0.0.1:0", "unix"])
async def test_a_stopped_listening_host_is_lost(
    short_heartbeat: None, listen: str, tmp_path: Path
) -> None:
    address = f"unix:{tmp_path / 'host.sock'}" if listen == "unix" else listen
    with trio.fail_after(30):
        async with listening_host(listen=address) as host:
            async with codemode.open_remote_provider([host.address]) as provider:
                await _loses_a_stopped_host(provider, host.process.pid)
            assert await host.stop() == 0


async def test_a_short_stop_is_not_a_loss() -> None:
    """At the default interval, a host stopped for 0.4 s (a debugger, a loaded machine) is
    the same host afterwards."""
    with trio.fail_after(30):
        async with codemode.open_process_provider() as provider:
            session = await provider.create_session()
            delegate = RecordingDelegate()
            assert texts(await run(session, delegate, "text('1')")) == ["1"]
            (host,) = provider.statistics().hosts
            assert host.pid is not None
            with stopped(host.pid):
                await trio.sleep(0.4)  # the stop itself is what is tested
            response = await run(session, delegate, "text('2')")
            assert texts(response) == ["2"]
            assert response.cell_id == "2"  # the same generation: not replaced


_Stream = trio.StapledStream[trio.testing.MemorySendStream, trio.testing.MemoryReceiveStream]


@asynccontextmanager
async def served_host(
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[tuple[_Stream, trio.Event]]:
    """A host connection served in this process over memory streams; the event is set when
    `serve_connection` returned and its stream was closed."""
    monkeypatch.setattr(_heartbeat, "HEARTBEAT_INTERVAL", 0.05)
    client, host = trio.testing.memory_stream_pair()
    done = trio.Event()

    async def serve() -> None:
        await serve_connection(host, host, workers=1, inventory_signal=False)
        await host.aclose()  # as a listener closes the stream of a connection it served
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        yield client, done
        nursery.cancel_scope.cancel()


async def test_the_host_closes_a_connection_whose_client_stopped_answering(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with trio.fail_after(30):
        async with served_host(monkeypatch) as (client, done):
            hello = Hello(
                supported_versions=[1],
                optional_capabilities=[HEARTBEAT_CAPABILITY],
                codemode_version=version("codemode"),
            )
            await client.send_all(FrameEncoder().encode(hello))
            decoder: FrameDecoder[HostMessage] = FrameDecoder(HostMessage)  # type: ignore[arg-type]
            ready = await receive_message(client, decoder)
            assert isinstance(ready, Ready)
            assert HEARTBEAT_CAPABILITY in ready.capabilities
            # The client answers nothing: the host pings it, then gives up on it (it stops
            # serving; whoever owns the stream closes it, as a listener or the host's exit does).
            pings: list[HostMessage] = []

            async def collect() -> None:
                while (message := await receive_message(client, decoder)) is not None:
                    pings.append(message)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(collect)
                await done.wait()
                nursery.cancel_scope.cancel()
            assert pings == [Ping()] * 3  # a ping per silent interval before the last
        assert (
            "closing a connection: the client sent nothing received for 4 heartbeat" in caplog.text
        )


async def test_a_ping_is_answered_and_a_client_without_the_capability_gets_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with trio.fail_after(30):
        async with served_host(monkeypatch) as (client, done):
            await client.send_all(FrameEncoder().encode(Hello(supported_versions=[1])))
            decoder: FrameDecoder[HostMessage] = FrameDecoder(HostMessage)  # type: ignore[arg-type]
            ready = await receive_message(client, decoder)
            assert isinstance(ready, Ready)
            assert HEARTBEAT_CAPABILITY not in ready.capabilities
            # Without the capability a ping is a protocol error that ends the connection, and
            # the host pings nobody.
            await client.send_all(FrameEncoder().encode(Ping()))
            assert await receive_message(client, decoder) is None
            await done.wait()
        async with served_host(monkeypatch) as (client, done):
            hello = Hello(supported_versions=[1], optional_capabilities=[HEARTBEAT_CAPABILITY])
            await client.send_all(FrameEncoder().encode(hello))
            answers: FrameDecoder[HostMessage] = FrameDecoder(HostMessage)  # type: ignore[arg-type]
            first = await receive_message(client, answers)
            assert isinstance(first, Ready)
            await client.send_all(FrameEncoder().encode(Ping()))
            assert await receive_message(client, answers) == Pong()
            await client.aclose()
            await done.wait()
