"""`codemode-host --listen`: the protocol over TCP and Unix sockets, tokens, TLS, versions, and
clients that vanish. Every host is a real process (`tests/remote_hosts.py`); all traffic stays
on loopback or a Unix socket."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import stat
import struct
import subprocess
from pathlib import Path

import pytest
import trio

import codemode
from codemode import Completed, HostLostError, Yielded
from codemode._trio._sockets import (
    KEEPALIVE_COUNT,
    KEEPALIVE_IDLE,
    KEEPALIVE_INTERVAL,
    HostAddress,
    connect,
    open_listener,
    parse_address,
)
from codemode._wire import HostLink
from codemode.protocol import (
    CAPABILITIES,
    NEED_DATA,
    Answered,
    ClientConnection,
    ClientEvent,
    ConnectionEnded,
    HandshakeCompleted,
    InitialAnswered,
)
from codemode.remote._transport import SocketHost, installed_version
from tests.certificates import self_signed
from tests.delegates import RecordingDelegate
from tests.remote_hosts import host_command, listening_host
from tests.sessions import run, texts, tool

TOKEN = "correct-horse-battery-staple"
TOKEN_VARIABLE = "CODEMODE_HOST_TOKEN"


def _token_file(tmp_path: Path, token: str = TOKEN) -> str:
    path = tmp_path / "token"
    path.write_text(token + "\n")
    return str(path)


# ---- addresses and sockets ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("tcp://127.0.0.1:0", HostAddress("tcp", host="127.0.0.1", port=0)),
        ("tcp://[::1]:8765", HostAddress("tcp", host="::1", port=8765)),
        ("tcp://localhost:1", HostAddress("tcp", host="localhost", port=1)),
        ("unix:/tmp/h.sock", HostAddress("unix", path="/tmp/h.sock")),
        ("unix:///tmp/h.sock", HostAddress("unix", path="/tmp/h.sock")),
        ("unix:relative.sock", HostAddress("unix", path="relative.sock")),
    ],
)
def test_addresses_parse_and_print(text: str, expected: HostAddress) -> None:
    address = parse_address(text)
    assert address == expected
    assert parse_address(str(address)) == address


@pytest.mark.parametrize(
    "text",
    ["127.0.0.1:1", "http://h:1", "tcp://h", "tcp://h:x", "tcp://h:1/path", "tcp://:1", "unix:"],
)
def test_bad_addresses_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="address"):
        parse_address(text)


def test_credentials_in_an_address_are_refused_without_echo() -> None:
    with pytest.raises(ValueError, match="must not include credentials") as caught:
        parse_address("tcp://user:hunter2@127.0.0.1:1")
    assert "hunter2" not in str(caught.value)
    with pytest.raises(ValueError, match="address") as caught:
        parse_address("grpc://user:hunter2@127.0.0.1:1")
    assert "hunter2" not in str(caught.value)


async def test_tcp_connections_keep_alive_on_both_ends() -> None:
    with trio.fail_after(10):
        listener, bound = await open_listener(HostAddress("tcp", host="127.0.0.1"))
        async with listener:
            client = await connect(bound)
            assert isinstance(client, trio.SocketStream)
            sock = client.socket
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == KEEPALIVE_IDLE
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == KEEPALIVE_INTERVAL
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == KEEPALIVE_COUNT
            await client.aclose()


# ---- the command line --------------------------------------------------------------------


def _start(*arguments: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {name: value for name, value in os.environ.items() if name != TOKEN_VARIABLE}
    environment.update(env or {})
    return subprocess.run(
        host_command(*arguments), capture_output=True, text=True, timeout=30, env=environment
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("arguments", "reason"),
    [
        (
            ["--listen", "tcp://0.0.0.0:0"],
            "refusing to listen on tcp://0.0.0.0:0 without a token: only a loopback address or"
            " a Unix socket may be served without one (--token-file or $CODEMODE_HOST_TOKEN)",
        ),
        (["--listen", "ftp://x:1"], "--listen: a code-mode host address is tcp://HOST:PORT"),
        (["--token-file", "/nonexistent"], "--token-file only applies with --listen"),
        (["--listen", "unix:/tmp/x", "--tls-cert", "c.pem"], "--tls-cert and --tls-key go"),
        (["--listen", "unix:/tmp/x", "--token-file", "/nonexistent"], "cannot read the token"),
    ],
)
def test_listening_mistakes_are_one_line_and_status_2(arguments: list[str], reason: str) -> None:
    done = _start(*arguments)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, lines
    assert reason in lines[0]


@pytest.mark.slow
def test_a_blank_token_is_refused(tmp_path: Path) -> None:
    done = _start("--listen", "unix:/tmp/never", env={"CODEMODE_HOST_TOKEN": "two words"})
    assert done.returncode == 2
    assert "$CODEMODE_HOST_TOKEN must hold one token, without spaces" in done.stderr
    assert "two words" not in done.stderr


# ---- serving -----------------------------------------------------------------------------


@pytest.mark.slow
async def test_tcp_with_a_token_file_serves_cells_and_tool_calls(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with listening_host("--token-file", _token_file(tmp_path)) as host:
            assert host.address.startswith("tcp://127.0.0.1:")
            assert int(host.address.rsplit(":", 1)[1]) > 0  # the real port, not 0
            async with codemode.open_remote_provider([host.address], token=TOKEN) as provider:
                session = await provider.create_session()
                delegate = RecordingDelegate()
                source = (
                    'const r = await tools.echo({n: 1}); text(JSON.stringify(r)); store("k", 2)'
                )
                response = await run(session, delegate, source, tools=[tool("echo")])
                assert isinstance(response, Completed), response
                assert texts(response) == ['{"value":"output"}']
                assert [call.input for call in delegate.invocations] == [{"n": 1}]
                again = await run(session, delegate, 'text(load("k"))')
                assert texts(again) == ["2"]
                assert again.cell_id == "2"
            assert await host.stop() == 0


@pytest.mark.slow
async def test_unix_socket_with_an_environment_token(tmp_path: Path) -> None:
    path = tmp_path / "host.sock"
    with trio.fail_after(60):
        env = {"CODEMODE_HOST_TOKEN": TOKEN}
        async with listening_host(listen=f"unix:{path}", env=env) as host:
            assert host.address == f"unix:{path}"
            assert stat.S_ISSOCK(path.stat().st_mode)
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
            async with codemode.open_remote_provider([host.address], token=TOKEN) as provider:
                session = await provider.create_session()
                response = await run(session, RecordingDelegate(), "text('over unix')")
                assert texts(response) == ["over unix"]
            assert await host.stop(signal.SIGINT) == 0
        assert not path.exists()  # removed on exit


@pytest.mark.slow
async def test_a_stale_socket_file_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "host.sock"
    with trio.fail_after(60):
        async with listening_host(listen=f"unix:{path}") as host:
            await host.stop(signal.SIGKILL)
        assert path.exists()  # a killed host leaves its file behind
        async with (
            listening_host(listen=f"unix:{path}") as host,
            codemode.open_remote_provider([host.address]) as provider,
        ):
            session = await provider.create_session()
            assert texts(await run(session, RecordingDelegate(), "text(1)")) == ["1"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("token", "text"),
    [
        ("wrong-token", "the client's token is wrong"),
        (None, "the host requires a token and the client sent none"),
    ],
)
async def test_a_wrong_or_missing_token_is_refused_and_the_host_serves_on(
    tmp_path: Path, token: str | None, text: str
) -> None:
    with trio.fail_after(60):
        async with listening_host("--token-file", _token_file(tmp_path)) as host:
            async with codemode.open_remote_provider([host.address], token=token) as provider:
                with pytest.raises(HostLostError) as caught:
                    await provider.create_session()
            message = str(caught.value)
            assert f"code-mode host rejected the handshake: {text}" in message
            assert host.address in message
            assert TOKEN not in message
            if token is not None:
                assert token not in message
            async with codemode.open_remote_provider([host.address], token=TOKEN) as provider:
                session = await provider.create_session()
                assert texts(await run(session, RecordingDelegate(), "text('ok')")) == ["ok"]
            assert TOKEN not in host.log()


@pytest.mark.slow
async def test_a_version_mismatch_is_refused_naming_both_versions() -> None:
    with trio.fail_after(60):
        async with listening_host() as host, trio.open_nursery() as nursery:
            address = parse_address(host.address)
            link = HostLink(SocketHost(address, codemode_version="0.0.0-elsewhere"))
            with pytest.raises(HostLostError) as caught:
                await nursery.start(link.run)
            assert str(caught.value) == (
                f"code-mode host rejected the handshake: the host runs codemode"
                f" {installed_version()} and this client codemode 0.0.0-elsewhere; install the"
                f" same codemode version on both sides ({host.address})"
            )


@pytest.mark.slow
async def test_tls_serves_a_trusting_client_and_refuses_the_others(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    options = (
        "--tls-cert",
        str(cert),
        "--tls-key",
        str(key),
        "--token-file",
        _token_file(tmp_path),
    )
    with trio.fail_after(60):
        async with listening_host(*options) as host:
            trusting = ssl.create_default_context(cafile=str(cert))
            async with codemode.open_remote_provider(
                [host.address], token=TOKEN, ssl_context=trusting
            ) as provider:
                session = await provider.create_session()
                response = await run(session, RecordingDelegate(), "text('over tls')")
                assert texts(response) == ["over tls"]
            # A client that does not trust the certificate stops at the TLS handshake.
            async with codemode.open_remote_provider(
                [host.address], token=TOKEN, ssl_context=ssl.create_default_context()
            ) as provider:
                with pytest.raises(HostLostError, match=r"TLS handshake failed: .*CERTIFICATE"):
                    await provider.create_session()
            # A client without TLS gets nowhere: the host drops it at the handshake.
            async with codemode.open_remote_provider(
                [host.address], token=TOKEN, handshake_timeout=10
            ) as provider:
                with pytest.raises(HostLostError, match="code-mode host closed the connection"):
                    await provider.create_session()
            assert await host.stop() == 0


# ---- clients that vanish -----------------------------------------------------------------


async def _next(stream: trio.SocketStream, client: ClientConnection) -> ClientEvent:
    while (event := client.next_event()) is NEED_DATA:
        await stream.send_all(client.data_to_send())
        client.receive_data(await stream.receive_some(65536))
    assert not isinstance(event, ConnectionEnded)
    return event


@pytest.mark.slow
async def test_a_client_dropped_mid_cell_frees_its_cells_and_the_host_serves_on() -> None:
    # One engine worker: the dropped client's spinning cell holds it until the host
    # terminates that cell, so the other client's cell completes only if it did.
    with trio.fail_after(60):
        async with listening_host("--workers", "1", "--max-workers", "1") as host:
            address = parse_address(host.address)
            stream = await trio.open_tcp_stream(address.host, address.port)
            client = ClientConnection(
                optional_capabilities=CAPABILITIES, codemode_version=installed_version()
            )
            assert isinstance(await _next(stream, client), HandshakeCompleted)
            client.open_session("s", None)
            assert isinstance(await _next(stream, client), Answered)
            spin = codemode.ExecuteRequest(
                tool_call_id="c", source="while (true) {}", yield_time_ms=50
            )
            request_id = client.execute("s", spin)
            assert isinstance(await _next(stream, client), Answered)
            client.take_initial(request_id)
            initial = await _next(stream, client)
            assert isinstance(initial, InitialAnswered)
            assert isinstance(initial.result.value, Yielded)  # type: ignore[union-attr]
            # Drop it: a reset, not a goodbye.
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            stream.socket.close()
            async with codemode.open_remote_provider([host.address]) as provider:
                session = await provider.create_session()
                response = await run(session, RecordingDelegate(), "text('served')")
                assert isinstance(response, Completed)
                assert texts(response) == ["served"]
            assert await host.stop() == 0
