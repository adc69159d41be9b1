"""Connections own their failure (h11's rule): after any protocol error every call raises.

The defect: after `ClientConnection.next_event()` raised `RemoteProtocolError`, the next call
decoded the next frame and raised again, `is_open` stayed true and `open_session(...)` queued
bytes; the rule lived in the trio adapters. Now the connection moves itself to ERROR inside
`next_event` (or on `send_failed()`), and every later operation raises `LocalProtocolError`.
The clean-up notifications (`cancel`, `abandon`, `undelivered`, `release_initial`) and
`connection_lost()` stay accepted: adapters call them from cancelled tasks.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from codemode import ExecuteRequest, NestedToolCall, ToolKind, ToolName
from codemode.protocol import (
    ClientConnection,
    Err,
    ErrorKind,
    Execute,
    FrameEncoder,
    Hello,
    HostConnection,
    HostResponse,
    LocalProtocolError,
    Ok,
    OperationRequest,
    OperationResponse,
    Ready,
    RemoteProtocolError,
    SessionReady,
    ToolInvoke,
    ToolResult,
)
from codemode.protocol._states import ConnectionState
from tests.protocol_pair import Pair
from tests.test_protocol_connections import REQUEST, opened, start

_encoder = FrameEncoder()


def _raw(tree: object) -> bytes:
    payload = msgspec.msgpack.encode(tree)
    return len(payload).to_bytes(4, "little") + payload


def _client_operations(client: ClientConnection) -> list[Callable[[], Any]]:
    return [
        lambda: client.next_event(),
        lambda: client.receive_data(b"\x00"),
        lambda: client.open_session("t", None),
        lambda: client.execute("s", REQUEST),
        lambda: client.wait("s", "1", 10),
        lambda: client.preempt("s", "1"),
        lambda: client.terminate("s", "1"),
        lambda: client.shutdown_session("s"),
        lambda: client.cells("s"),
    ]


def _host_operations(host: HostConnection) -> list[Callable[[], Any]]:
    invoke = ToolInvoke(
        invocation=NestedToolCall(
            cell_id="1",
            runtime_tool_call_id="t",
            tool_name=ToolName.plain("x"),
            tool_kind=ToolKind.FUNCTION,
            input={},
        )
    )
    return [
        lambda: host.next_event(),
        lambda: host.receive_data(b"\x00"),
        lambda: host.respond(2, Ok(value=SessionReady(session_id="s"))),
        lambda: host.respond_initial(2, Err(kind=ErrorKind.INTERNAL, message="x")),
        lambda: host.cell_closed("s", "1"),
        lambda: host.call_client("s", "1", invoke),
    ]


def _assert_poisoned(operations: list[Callable[[], Any]]) -> None:
    for operation in operations:
        with pytest.raises(LocalProtocolError, match="unusable after an error"):
            operation()


def _is_open(connection: ClientConnection) -> bool:
    return connection.is_open


def _broken_client() -> Pair:
    """A pair with a live cell whose client just got a frame it cannot decode."""
    pair = opened()
    start(pair)
    pair.client.receive_data(_raw({"type": "cell/closed", "session_id": 1}))
    pair.client.receive_data(_encoder.encode(Ready(selected_version=1, capabilities=[])))
    return pair


def test_after_a_protocol_error_every_client_operation_raises() -> None:
    pair = _broken_client()
    client = pair.client
    assert _is_open(client)
    with pytest.raises(RemoteProtocolError, match="failed to decode"):
        client.next_event()
    # The next frame (a second handshake answer, also a protocol error) is never decoded.
    assert client.state is ConnectionState.ERROR
    assert not _is_open(client)
    _assert_poisoned(_client_operations(client))
    queued = client.data_to_send()
    assert queued == b"", "a poisoned connection queued bytes"


def test_clean_up_notifications_are_accepted_after_the_error() -> None:
    pair = _broken_client()
    client = pair.client
    with pytest.raises(RemoteProtocolError):
        client.next_event()
    client.cancel(2)
    client.abandon(2, "s", "1")
    client.release_initial(2)
    ready: Ok[HostResponse] = Ok(value=SessionReady(session_id="s"))
    client.undelivered(3, "s", ready)
    assert client.send_delegate_response(1, Ok(value=ToolResult(result=1))) is False
    assert client.data_to_send() == b""
    assert client.connection_lost() == [("s", "1")]  # the cells the adapter must end
    assert client.state is ConnectionState.ERROR, "the adapter's report of the loss keeps the error"
    _assert_poisoned(_client_operations(client))


class _BrokenEvents(collections.deque[Any]):
    """An event queue whose every append fails: a bug inside the connection's machine."""

    def append(self, event: object) -> None:
        raise KeyError("a bug on this side")


def test_any_exception_inside_next_event_poisons_the_connection() -> None:
    # The bug is put where compiled modules call out too (docs/compiled.md): a method of a
    # native class cannot be patched, an object handed to one can.
    pair = opened()
    rid = pair.client.open_session("t", None)
    pair.to_host()
    pair.client._events = pair.client._operations._events = _BrokenEvents()
    pair.host.respond(rid, Ok(value=SessionReady(session_id="t")))
    pair.client.receive_data(pair.host.data_to_send())
    with pytest.raises(KeyError):
        pair.client.next_event()
    assert pair.client.state is ConnectionState.ERROR
    _assert_poisoned(_client_operations(pair.client))


def test_send_failed_poisons_the_connection() -> None:
    pair = opened()
    pair.client.send_failed()
    assert pair.client.state is ConnectionState.ERROR
    _assert_poisoned(_client_operations(pair.client))
    pair.host.send_failed()
    _assert_poisoned(_host_operations(pair.host))


def test_after_a_protocol_error_every_host_operation_raises() -> None:
    pair = opened()
    start(pair)
    pair.host.receive_data(_encoder.encode(Hello(supported_versions=[1])))
    with pytest.raises(RemoteProtocolError, match="second code-mode client hello"):
        pair.host.next_event()
    assert pair.host.state is ConnectionState.ERROR
    _assert_poisoned(_host_operations(pair.host))
    pair.host.cancel_call(1)  # a clean-up notification: accepted, does nothing


def test_the_end_of_the_stream_closes_without_an_error() -> None:
    pair = opened()
    pair.client.receive_data(b"")
    pair.client.next_event()
    assert pair.client.state is ConnectionState.CLOSED
    with pytest.raises(LocalProtocolError, match="connection is closed"):
        pair.client.open_session("t", None)


# ---- the host answers a broken body after the handshake ----------------------------------


def test_a_request_body_that_does_not_decode_is_answered_for_its_id() -> None:
    pair = opened()
    tree = msgspec.to_builtins(
        OperationRequest(
            id=7,
            request=_execute_tree_source(),
        )
    )
    tree["request"]["request"]["source"] = 5
    pair.host.receive_data(_raw(tree))
    assert pair.host.next_event() is not None
    frames = pair.host.data_to_send()
    answer = msgspec.msgpack.decode(frames[4:], type=OperationResponse)
    assert answer.id == 7
    assert answer.result == Err(
        kind=ErrorKind.INVALID_REQUEST,
        message="invalid code-mode request: Expected `str`, got `int` - at `$.request.request.source`",
    )
    assert pair.host.state is ConnectionState.OPEN
    # Its id is spent: a repeat is a protocol error, as for any finished request.
    pair.host.receive_data(_raw(tree))
    with pytest.raises(RemoteProtocolError, match="duplicate code-mode request ID 7"):
        pair.host.next_event()


def test_before_the_handshake_a_broken_frame_ends_the_connection() -> None:
    host = HostConnection()
    host.receive_data(_raw({"type": "operation/request", "id": 1, "request": {}}))
    with pytest.raises(RemoteProtocolError, match="failed to decode"):
        host.next_event()
    assert host.state is ConnectionState.ERROR


def _execute_tree_source() -> Execute:
    return Execute(session_id="s", request=ExecuteRequest(tool_call_id="c", source="text(1)"))
