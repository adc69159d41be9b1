"""Resuming a cut connection, sans-IO: sequence numbers, acknowledgements and the replay
(`codemode/protocol/_replay.py`), with both connections in memory and the cut made by hand:
bytes lost mid-frame in both directions, frames queued while no stream is attached."""

from __future__ import annotations

import pytest

from codemode import ExecuteRequest
from codemode.protocol import (
    HEARTBEAT_CAPABILITY,
    LIMITS_CAPABILITY,
    NEED_DATA,
    RESUME_CAPABILITY,
    Answered,
    ClientConnection,
    ConnectionResumed,
    ExecutionStarted,
    GoodbyeReceived,
    HostConnection,
    LocalProtocolError,
    Ok,
    RequestReceived,
    ResumeFailed,
    ResumeRequested,
    SessionReady,
)

CAPABILITIES = (LIMITS_CAPABILITY, HEARTBEAT_CAPABILITY, RESUME_CAPABILITY)


def _deliver(data: bytes, to: ClientConnection | HostConnection) -> list[object]:
    if data:
        to.receive_data(data)
    events: list[object] = []
    while (event := to.next_event()) is not NEED_DATA:
        events.append(event)
    return events


def _pair() -> tuple[ClientConnection, HostConnection]:
    client = ClientConnection(optional_capabilities=CAPABILITIES)
    host = HostConnection(supported_capabilities=CAPABILITIES, resume_grace=7.5)
    _deliver(client.data_to_send(), host)
    _deliver(host.data_to_send(), client)
    assert client.resumable
    assert host.resumable
    assert client.resume_token == host.resume_token is not None
    assert client.resume_grace == 7.5
    return client, host


def _open(client: ClientConnection, host: HostConnection) -> None:
    request_id = client.open_session("s", None)
    (received,) = _deliver(client.data_to_send(), host)
    assert isinstance(received, RequestReceived)
    host.respond(request_id, Ok(value=SessionReady(session_id="s")))
    (answered,) = _deliver(host.data_to_send(), client)
    assert isinstance(answered, Answered)


def _resume(client: ClientConnection, host: HostConnection) -> list[object]:
    """Both sides noticed the cut; the client presents its token on a new stream, the host's
    listener finds `host` by it; the client's events after the replay."""
    client.begin_resume()
    fresh = HostConnection(supported_capabilities=CAPABILITIES)
    (asked,) = _deliver(client.data_to_send(), fresh)
    assert isinstance(asked, ResumeRequested)
    assert asked.token == host.resume_token
    assert host.resume(asked.received)
    return _deliver(host.data_to_send(), client)


def test_a_cut_mid_frame_both_ways_loses_and_repeats_nothing() -> None:
    client, host = _pair()
    _open(client, host)
    # A wait reaches the host only in part; the host's answer to it, in part too.
    wait_id = client.wait("s", "c1", 100)
    request = client.data_to_send()
    _deliver(request[: len(request) // 2], host)
    client.suspend()
    host.suspend()
    # Queued while no stream is attached: kept for the replay, written nowhere.
    terminate_id = client.terminate("s", "c2")
    assert client.data_to_send() == b""
    events = _resume(client, host)
    assert isinstance(events[0], ConnectionResumed)
    # The client replays both requests: the host receives each exactly once.
    received = _deliver(client.data_to_send(), host)
    assert [type(event) for event in received] == [RequestReceived, RequestReceived]
    assert [event.request_id for event in received] == [wait_id, terminate_id]  # type: ignore[attr-defined]


def test_answers_queued_for_a_dead_stream_are_replayed_once() -> None:
    client, host = _pair()
    _open(client, host)
    execute_id = client.execute(
        "s", ExecuteRequest(tool_call_id="t", source="text(1)", enabled_tools=[])
    )
    (received,) = _deliver(client.data_to_send(), host)
    assert isinstance(received, RequestReceived)
    host.respond(execute_id, Ok(value=ExecutionStarted(cell_id="c1")))
    answer = host.data_to_send()
    _deliver(answer[:3], client)  # the stream dies three bytes into the answer
    client.suspend()
    host.suspend()
    events = _resume(client, host)
    assert [type(event) for event in events] == [ConnectionResumed, Answered]
    # Nothing more: the answer came once.
    assert _deliver(host.data_to_send(), client) == []


def test_acknowledged_frames_are_forgotten() -> None:
    client, host = _pair()
    _open(client, host)
    for number in range(100):
        client.wait("s", f"c{number}", 100)
    _deliver(client.data_to_send(), host)
    assert client.unacknowledged[0] == 101  # the open and the waits
    _deliver(host.data_to_send(), client)  # the host acknowledged 64 with its own frames
    assert client.unacknowledged[0] == 101 - 64
    assert host.ping()
    _deliver(host.data_to_send(), client)  # a ping carries the rest
    assert client.unacknowledged == (0, 0)


def test_a_resume_with_counts_that_do_not_match_is_refused() -> None:
    client, host = _pair()
    _open(client, host)
    assert not host.resume(5)  # the client cannot have received frames never sent
    fresh = HostConnection(supported_capabilities=CAPABILITIES)
    client.suspend()
    client.begin_resume()
    _deliver(client.data_to_send(), fresh)
    fresh.refuse_resume("unknown or spent resume token")
    (failed,) = _deliver(fresh.data_to_send(), client)
    assert isinstance(failed, ResumeFailed)
    assert failed.reason == (
        "code-mode host refused to resume the connection: unknown or spent resume token"
    )


def test_a_resumed_connection_spends_its_token() -> None:
    client, host = _pair()
    first = client.resume_token
    client.suspend()
    host.suspend()
    _resume(client, host)
    assert client.resume_token == host.resume_token != first


def test_goodbye_is_an_event_and_only_with_resume() -> None:
    client, host = _pair()
    client.goodbye()
    assert _deliver(client.data_to_send(), host) == [GoodbyeReceived()]
    plain = ClientConnection(optional_capabilities=(LIMITS_CAPABILITY,))
    plain.goodbye()  # nothing to say without resume
    assert b"goodbye" not in plain.data_to_send()


def test_suspend_needs_resume() -> None:
    plain = ClientConnection(optional_capabilities=(LIMITS_CAPABILITY,))
    with pytest.raises(LocalProtocolError):
        plain.suspend()


def test_a_host_without_the_capability_gives_no_token() -> None:
    client = ClientConnection(optional_capabilities=CAPABILITIES)
    host = HostConnection(supported_capabilities=(LIMITS_CAPABILITY, HEARTBEAT_CAPABILITY))
    _deliver(client.data_to_send(), host)
    _deliver(host.data_to_send(), client)
    assert not client.resumable
    assert client.resume_token is None
