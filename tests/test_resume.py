"""Resumable connections over a real listening host, through a TCP proxy that cuts, stalls and
half-opens them on command (`tests/cutting_proxy.py`; docs/durability.md).

Every cut is made at a moment the test chose (a tool call running, a frame half through), and
every check is of what the application saw: each output line exactly once, each tool call run
exactly once, no `RuntimeReplacedError` within the grace, and exactly one per session past it.
"""

from __future__ import annotations

import random
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import version
from pathlib import Path

import pytest
import trio

import codemode
from codemode import (
    HostLostError,
    JsonValue,
    NestedToolCall,
    Pending,
    RuntimeReplacedError,
    RuntimeResponse,
    WaitRequest,
    Yielded,
)
from codemode._trio import _heartbeat
from codemode.errors import RUNTIME_REPLACED
from codemode.protocol import (
    HEARTBEAT_CAPABILITY,
    RESUME_CAPABILITY,
    FrameDecoder,
    FrameEncoder,
    Goodbye,
    Hello,
    HostMessage,
    Ready,
    Rejected,
    Resume,
    Resumed,
    ResumeRefused,
)
from tests.certificates import self_signed
from tests.cutting_proxy import CuttingProxy, cutting_proxy
from tests.delegates import RecordingDelegate
from tests.frames import receive_message
from tests.remote_hosts import RunningHost, listening_host
from tests.sessions import execute, run, texts, tool

pytestmark = pytest.mark.slow


@asynccontextmanager
async def behind_a_proxy(
    *options: str,
) -> AsyncIterator[tuple[RunningHost, CuttingProxy, codemode.Provider]]:
    """A listening host, a proxy in front of it, and a remote provider through the proxy."""
    async with (
        listening_host(*options) as host,
        cutting_proxy(host.address) as proxy,
        codemode.open_remote_provider([proxy.address]) as provider,
    ):
        yield host, proxy, provider


async def _survives_a_cut(provider: codemode.Provider, proxy: CuttingProxy) -> None:
    """A session's stored value outlives a cut: the connection was resumed, not replaced."""
    session = await provider.create_session()
    delegate = RecordingDelegate()
    assert texts(await run(session, delegate, "store('k', 1); text('a')")) == ["a"]
    proxy.cut()
    assert texts(await run(session, delegate, "text(String(load('k')))")) == ["1"]
    assert proxy.accepted == 2


def _collect(into: list[str], response: RuntimeResponse | Pending) -> bool:
    """Add the response's lines; True once the cell ended."""
    into.extend(texts(response))
    return not isinstance(response, Yielded)


async def test_a_cut_during_a_wait_loses_nothing() -> None:
    with trio.fail_after(60):
        async with behind_a_proxy() as (_, proxy, provider):
            session = await provider.create_session()
            delegate = RecordingDelegate()
            delegate.hold_tools = True
            started = await execute(
                session,
                delegate,
                "text('before'); await tools.slow({}); text('after')",
                tools=[tool("slow")],
                yield_time_ms=None,
            )
            await delegate.until(lambda: len(delegate.invocations) == 1)
            proxy.cut()  # the execute's initial observation is waiting on the host
            delegate.release.set()
            assert texts(await started.initial_response()) == ["before", "after"]
            assert delegate.cancelled_tools == []  # the cut cancelled nothing
            assert proxy.cuts == 1
            assert proxy.accepted == 2  # one resume
            assert len(delegate.invocations) == 1


async def test_a_cut_during_a_tool_call_runs_it_once() -> None:
    with trio.fail_after(60):
        async with behind_a_proxy() as (_, proxy, provider):
            session = await provider.create_session()

            async def cut_then_answer(call: NestedToolCall) -> JsonValue:
                proxy.cut()  # the host is waiting for this answer
                return {"value": "answered"}

            delegate = RecordingDelegate(on_tool=cut_then_answer)
            response = await run(
                session,
                delegate,
                "const r = await tools.echo({}); text(JSON.stringify(r))",
                tools=[tool("echo")],
            )
            assert texts(response) == ['{"value":"answered"}']
            assert len(delegate.invocations) == 1
            assert delegate.cancelled_tools == []


async def test_a_cut_inside_a_large_output_frame_loses_nothing() -> None:
    with trio.fail_after(60):
        async with behind_a_proxy() as (_, proxy, provider):
            session = await provider.create_session()
            delegate = RecordingDelegate()
            proxy.cut_after(300_000)  # inside the response's frame of about 2 MB
            response = await run(
                session,
                delegate,
                "for (let i = 0; i < 20000; i++) text(String(i).padEnd(100, '.'))",
            )
            lines = texts(response)
            assert [line.rstrip(".") for line in lines] == [str(i) for i in range(20000)]
            assert proxy.cuts == 1


async def test_a_cut_unix_socket_connection_resumes(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with (
            listening_host(listen=f"unix:{tmp_path / 'host.sock'}") as host,
            cutting_proxy(host.address, listen=f"unix:{tmp_path / 'proxy.sock'}") as proxy,
            codemode.open_remote_provider([proxy.address]) as provider,
        ):
            await _survives_a_cut(provider, proxy)


async def test_a_half_open_connection_is_taken_over_by_the_resume() -> None:
    """The host never saw the cut: the client's resume makes it let go of the old stream."""
    with trio.fail_after(60):
        async with behind_a_proxy() as (_, proxy, provider):
            session = await provider.create_session()
            delegate = RecordingDelegate()
            assert texts(await run(session, delegate, "text(1)")) == ["1"]
            proxy.half_open()
            assert texts(await run(session, delegate, "text(2)")) == ["2"]


async def test_a_cut_longer_than_the_grace_replaces_the_runtime_once_per_session() -> None:
    with trio.fail_after(60):
        async with behind_a_proxy("--resume-grace", "1") as (_, proxy, provider):
            sessions = [await provider.create_session() for _ in range(2)]
            delegate = RecordingDelegate()
            waiting = []
            for session in sessions:
                assert texts(await run(session, delegate, "store('k', 1); text('stored')")) == [
                    "stored"
                ]
                started = await execute(session, delegate, "await new Promise(() => {})")
                waiting.append(started)
            proxy.refuse(True)  # the network is down: every reconnect is closed at once
            proxy.cut()
            for started in waiting:  # in flight when the resume gave up
                with pytest.raises(RuntimeReplacedError) as replaced:
                    await started.initial_response()
                assert str(replaced.value) == RUNTIME_REPLACED
            proxy.refuse(False)
            for session in sessions:  # once per session: the next generation just serves
                response = await run(session, delegate, "text(String(load('k')))")
                assert texts(response) == ["undefined"]


async def test_a_stall_is_a_silent_host_not_a_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stalled path keeps both sockets open: the client's heartbeat declares the host lost
    (a silent host is not resumed); the session's next operation says it was replaced."""
    monkeypatch.setattr(_heartbeat, "HEARTBEAT_INTERVAL", 0.1)
    with trio.fail_after(60):
        async with behind_a_proxy("--resume-grace", "1") as (_, proxy, provider):
            session = await provider.create_session()
            delegate = RecordingDelegate()
            started = await execute(session, delegate, "await new Promise(() => {})")
            proxy.stall()
            with pytest.raises(HostLostError, match="code-mode host stopped answering"):
                await started.initial_response()
            proxy.flow()
            with pytest.raises(RuntimeReplacedError):
                await run(session, delegate, "text(1)")
            assert texts(await run(session, delegate, "text(2)")) == ["2"]


async def test_goodbye_frees_the_connection_at_once() -> None:
    """A connection whose client said goodbye is over when its stream ends: its token
    resumes nothing, however long the grace."""
    with trio.fail_after(60):
        async with listening_host("--resume-grace", "3600") as host:
            address = _tcp(host.address)
            stream, ready = await _hello(address)
            await stream.send_all(ENCODER.encode(Goodbye()))
            await trio.aclose_forcefully(stream)
            assert ready.resume_token is not None
            refused = await _ask(address, Resume(token=ready.resume_token, received=0))
            assert isinstance(refused, Rejected)
            assert isinstance(refused.reason, ResumeRefused)


async def test_a_resume_token_presented_twice_is_refused() -> None:
    with trio.fail_after(60):
        async with listening_host() as host:
            address = _tcp(host.address)
            stream, ready = await _hello(address)
            assert ready.resume_token is not None
            assert ready.resume_grace_ms == 30_000
            await trio.aclose_forcefully(stream)  # a cut: no goodbye
            resumed = await _ask(address, Resume(token=ready.resume_token, received=0))
            assert isinstance(resumed, Resumed)
            assert resumed.received == 0
            assert resumed.token != ready.resume_token
            again = await _ask(address, Resume(token=ready.resume_token, received=0))
            assert isinstance(again, Rejected)
            assert again.reason == ResumeRefused(
                message="unknown or spent resume token (its grace may have ended)"
            )
            # The token the resume gave works, once.
            assert isinstance(await _ask(address, Resume(token=resumed.token, received=0)), Resumed)
            assert "unknown or spent resume token" in host.log()
            assert ready.resume_token not in host.log()


ENCODER = FrameEncoder()


def _decoder() -> FrameDecoder[HostMessage]:
    return FrameDecoder(HostMessage)  # type: ignore[arg-type]


def _tcp(address: str) -> tuple[str, int]:
    host, _, port = address.removeprefix("tcp://").rpartition(":")
    return host, int(port)


async def _hello(address: tuple[str, int]) -> tuple[trio.SocketStream, Ready]:
    """A raw connection that completed its hello with resume."""
    stream = await trio.open_tcp_stream(*address)
    hello = Hello(
        supported_versions=[1],
        optional_capabilities=[HEARTBEAT_CAPABILITY, RESUME_CAPABILITY],
        codemode_version=version("codemode"),
    )
    await stream.send_all(ENCODER.encode(hello))
    ready = await receive_message(stream, _decoder())
    assert isinstance(ready, Ready)
    return stream, ready


async def _ask(address: tuple[str, int], message: object) -> HostMessage | None:
    """Send `message` as a new connection's first frame; the host's answer."""
    stream = await trio.open_tcp_stream(*address)
    try:
        await stream.send_all(ENCODER.encode(message))
        return await receive_message(stream, _decoder())
    finally:
        await trio.aclose_forcefully(stream)


async def test_lines_and_calls_survive_twenty_cuts_exactly_once() -> None:
    """3,000 numbered lines and 200 tool calls across 20 cuts, with waits cancelled at random
    moments too: every line once, in order, and every call run once."""
    seed = 20261203
    rng = random.Random(seed)
    lines = 3000
    calls: list[int] = []
    received: list[str] = []
    ended = False

    with trio.fail_after(120):
        async with behind_a_proxy() as (_, proxy, provider):

            async def count(call: NestedToolCall) -> JsonValue:
                assert isinstance(call.input, dict)
                number = call.input["n"]
                assert isinstance(number, int)
                calls.append(number)
                if len(calls) % 10 == 0:
                    proxy.cut()
                return {"n": number}

            delegate = RecordingDelegate(on_tool=count)
            session = await provider.create_session()
            source = (
                f"for (let i = 0; i < {lines}; i++) {{"
                " text(String(i));"
                " if (i % 15 == 14) { const r = await tools.count({n: i}); if (r.n !== i) throw"
                " new Error('wrong answer'); } }"
            )
            started = await execute(
                session, delegate, source, tools=[tool("count")], yield_time_ms=5
            )
            with trio.move_on_after(rng.uniform(0, 0.01)):
                ended = _collect(received, await started.initial_response())
            while not ended:
                with trio.move_on_after(rng.uniform(0, 0.01)):
                    outcome = await session.wait(
                        WaitRequest(cell_id=started.cell_id, yield_time_ms=5)
                    )
                    ended = _collect(received, outcome.response)
            assert proxy.cuts == 20
    assert received == [str(i) for i in range(lines)], f"seed {seed}"
    assert calls == list(range(14, lines, 15)), f"seed {seed}"


async def test_a_cut_tls_connection_resumes_with_a_new_tls_session(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    options = ("--tls-cert", str(cert), "--tls-key", str(key))
    with trio.fail_after(60):
        async with listening_host(*options) as host, cutting_proxy(host.address) as proxy:
            trusting = ssl.create_default_context(cafile=str(cert))
            async with codemode.open_remote_provider(
                [proxy.address], ssl_context=trusting
            ) as provider:
                await _survives_a_cut(provider, proxy)
