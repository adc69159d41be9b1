"""A cell closed by its initial response (`closing-initial-response`, docs/protocol.md,
"Ordering"): one frame where there were two, the same events on the client, and the old two
frames for a peer without the capability."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from codemode import Completed, ExecuteRequest, InputText, Yielded
from codemode.observability._report import CellReport
from codemode.protocol import (
    CLOSING_INITIAL_CAPABILITY,
    LIMITS_CAPABILITY,
    MAX_FRAME_BYTES,
    TRACE_CAPABILITY,
    Answered,
    CellClosed,
    CellEnded,
    Err,
    ErrorKind,
    ExecutionStarted,
    FrameEncoder,
    InitialAnswered,
    InitialResponse,
    Ok,
    RemoteProtocolError,
    RequestReceived,
    SessionClosed,
    SessionReady,
)
from tests.protocol_pair import Pair

REQUEST = ExecuteRequest(tool_call_id="call-1", source='text("hi")')
CLOSING = (LIMITS_CAPABILITY, CLOSING_INITIAL_CAPABILITY)
DONE = Completed(cell_id="1", content_items=[InputText(text="hi")])


def opened(capabilities: Iterable[str] = CLOSING) -> Pair:
    """A pair after the handshake, listing `capabilities`, with session `s` open."""
    pair = Pair(capabilities=capabilities)
    pair.flush()
    rid = pair.client.open_session("s", None)
    pair.to_host()
    pair.host.respond(rid, Ok(value=SessionReady(session_id="s")))
    pair.to_client()
    return pair


def start(pair: Pair) -> int:
    """Execute a cell the host admits as `1`; the execute's request id."""
    rid = pair.client.execute("s", REQUEST)
    (request,) = [e for e in pair.to_host() if isinstance(e, RequestReceived)]
    pair.host.respond(request.request_id, Ok(value=ExecutionStarted(cell_id="1")))
    pair.to_client()
    pair.client.take_initial(rid)
    return rid


def test_both_ends_select_the_capability() -> None:
    pair = opened()
    assert CLOSING_INITIAL_CAPABILITY in pair.client.capabilities
    assert CLOSING_INITIAL_CAPABILITY in pair.host.capabilities


def test_a_cell_closed_before_its_initial_response_is_closed_by_it() -> None:
    pair = opened()
    rid = start(pair)
    sent = len(pair.host_frames)
    pair.host.cell_closed("s", "1")
    pair.host.respond_initial(rid, Ok(value=DONE))
    events = pair.to_client()
    assert pair.host_frames[sent:] == [InitialResponse(id=rid, result=Ok(value=DONE), closed=True)]
    # The same events, in the same order, as from the initial response and `cell/closed`.
    assert events == [
        InitialAnswered(request_id=rid, result=Ok(value=DONE)),
        CellEnded(session_id="s", cell_id="1"),
    ]
    assert pair.host.statistics().routes == 0
    assert pair.client.statistics().cells == 0


def test_the_closing_initial_response_carries_the_report_of_a_traced_cell() -> None:
    pair = opened((*CLOSING, TRACE_CAPABILITY))
    rid = start(pair)
    report = CellReport(outcome="completed", admitted_ns=1, turns=1)
    pair.host.cell_closed("s", "1", report)
    pair.host.respond_initial(rid, Ok(value=DONE))
    events = pair.to_client()
    assert pair.host_frames[-1] == InitialResponse(
        id=rid, result=Ok(value=DONE), closed=True, report=report
    )
    assert events[-1] == CellEnded(session_id="s", cell_id="1", report=report)


def assert_closed_apart(pair: Pair, initial: InitialResponse) -> None:
    """The host sent `initial`, then `cell/closed` in a frame of its own, and the client saw
    the cell end."""
    events = pair.to_client()
    kinds = [type(frame).__name__ for frame in pair.host_frames[-2:]]
    assert kinds == ["InitialResponse", "CellClosed"]
    assert pair.host_frames[-2] == initial
    assert events[-1] == CellEnded(session_id="s", cell_id="1")


def test_an_initial_response_over_the_frame_limit_still_closes_its_cell() -> None:
    pair = opened((*CLOSING, TRACE_CAPABILITY))
    rid = start(pair)
    report = CellReport(outcome="completed", admitted_ns=1)
    pair.host.cell_closed("s", "1", report)
    huge = Completed(cell_id="1", content_items=[InputText(text="x" * MAX_FRAME_BYTES)])
    pair.host.respond_initial(rid, Ok(value=huge))
    events = pair.to_client()
    (frame,) = [f for f in pair.host_frames if isinstance(f, InitialResponse)]
    assert isinstance(frame.result, Err)
    assert frame.result.kind is ErrorKind.FRAME_LIMIT
    assert (frame.closed, frame.report) == (True, report)
    assert events[-1] == CellEnded(session_id="s", cell_id="1", report=report)


def test_a_cell_open_at_its_initial_response_still_gets_cell_closed() -> None:
    pair = opened()
    rid = start(pair)
    yielded = Yielded(cell_id="1", content_items=[])
    pair.host.respond_initial(rid, Ok(value=yielded))
    pair.host.cell_closed("s", "1")
    assert_closed_apart(pair, InitialResponse(id=rid, result=Ok(value=yielded)))


def test_a_cancelled_execute_closes_its_cell_with_the_error() -> None:
    pair = opened()
    rid = start(pair)
    cancelled = Err(kind=ErrorKind.CANCELLED, message="code-mode request cancelled")
    pair.host.cell_closed("s", "1")
    pair.host.respond_initial(rid, cancelled)
    events = pair.to_client()
    assert pair.host_frames[-1] == InitialResponse(id=rid, result=cancelled, closed=True)
    assert events == [
        InitialAnswered(request_id=rid, result=cancelled),
        CellEnded(session_id="s", cell_id="1"),
    ]


def test_a_held_session_closed_follows_the_closing_initial_response() -> None:
    pair = opened()
    rid = start(pair)
    shutdown = pair.client.shutdown_session("s")
    (request,) = [e for e in pair.to_host() if isinstance(e, RequestReceived)]
    pair.host.respond(request.request_id, Ok(value=SessionClosed(session_id="s")))
    assert pair.to_client() == []  # held back: cell 1 is still open
    pair.host.cell_closed("s", "1")
    pair.host.respond_initial(rid, Ok(value=DONE))
    events = pair.to_client()
    assert [type(e).__name__ for e in events] == ["InitialAnswered", "CellEnded", "Answered"]
    assert events[-1] == Answered(
        request_id=shutdown, result=Ok(value=SessionClosed(session_id="s"))
    )


def test_a_host_without_the_capability_sends_cell_closed_apart() -> None:
    pair = opened((LIMITS_CAPABILITY,))
    rid = start(pair)
    pair.host.cell_closed("s", "1")
    pair.host.respond_initial(rid, Ok(value=DONE))
    assert_closed_apart(pair, InitialResponse(id=rid, result=Ok(value=DONE)))


def test_a_closing_initial_response_the_client_did_not_negotiate_breaks_the_connection() -> None:
    pair = opened((LIMITS_CAPABILITY,))
    rid = start(pair)
    frame = InitialResponse(id=rid, result=Ok(value=DONE), closed=True)
    pair.client.receive_data(FrameEncoder().encode(frame))
    with pytest.raises(RemoteProtocolError, match="without the `closing-initial-response`"):
        pair.client.next_event()


def test_a_closing_initial_response_of_a_closed_cell_breaks_the_connection() -> None:
    pair = opened()
    rid = start(pair)
    encoder = FrameEncoder()
    pair.client.receive_data(encoder.encode(CellClosed(session_id="s", cell_id="1")))
    assert pair.client.next_event() == CellEnded(session_id="s", cell_id="1")
    frame = InitialResponse(id=rid, result=Ok(value=DONE), closed=True)
    pair.client.receive_data(encoder.encode(frame))
    with pytest.raises(RemoteProtocolError, match=f"closed no live cell .* of {rid}$"):
        pair.client.next_event()
