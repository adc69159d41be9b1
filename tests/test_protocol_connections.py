"""The sans-IO connections as an in-memory pair: handshake, ids, order, retirement, limits.

No process, no trio: each test drives `ClientConnection` and `HostConnection` by hand (the
host's side plays the runtime) and asserts on the frames that cross and the events each side
produces. Reference names are those of design.md, host 11 (client driver tests, host
unit tests) where a test ports one.
"""

from __future__ import annotations

import pytest

from codemode import (
    Completed,
    ContentItem,
    ExecuteRequest,
    InputText,
    LiveCell,
    NestedToolCall,
    Terminated,
    ToolKind,
    ToolName,
    WaitOutcome,
    WaitRequest,
    Yielded,
    missing_cell,
)
from codemode.protocol import (
    MAX_FRAME_BYTES,
    Answered,
    CancelRequested,
    CellEnded,
    DelegateAnswered,
    DelegateCancelled,
    DelegateRequest,
    DelegateRequested,
    Err,
    ErrorKind,
    ExecutionStarted,
    FrameEncoder,
    FrameTooLargeError,
    HandshakeCompleted,
    Hello,
    HostConnection,
    HostResponse,
    InitialAnswered,
    InitialResponse,
    LocalProtocolError,
    NotificationDelivered,
    Ok,
    OperationCancel,
    OperationRequest,
    OperationResponse,
    RemoteProtocolError,
    RequestReceived,
    SessionClosed,
    SessionReady,
    ShutdownSession,
    Terminate,
    ToolInvoke,
    ToolResult,
    Wait,
    WaitCompleted,
)
from tests.protocol_pair import Pair

REQUEST = ExecuteRequest(tool_call_id="call-1", source="text(1)")


def text(*values: str) -> list[ContentItem]:
    return [InputText(text=value) for value in values]


def received(pair: Pair) -> list[RequestReceived]:
    return [e for e in pair.to_host() if isinstance(e, RequestReceived)]


def opened(session: str = "s", *, chunk: int | None = None) -> Pair:
    """A pair after the handshake with session `session` open."""
    pair = Pair(chunk=chunk)
    host_events, client_events = pair.flush()
    assert isinstance(host_events[0], HandshakeCompleted)
    assert isinstance(client_events[0], HandshakeCompleted)
    rid = pair.client.open_session(session, None)
    (request,) = received(pair)
    pair.host.respond(request.request_id, Ok(value=SessionReady(session_id=session)))
    assert pair.to_client() == [
        Answered(request_id=rid, result=Ok(value=SessionReady(session_id=session)))
    ]
    return pair


def start(pair: Pair, cell: str = "1", session: str = "s") -> int:
    """Execute a cell that the host admits as `cell`; returns the execute's request id."""
    rid = pair.client.execute(session, REQUEST)
    (request,) = received(pair)
    assert request.request_id == rid
    pair.host.respond(rid, Ok(value=ExecutionStarted(cell_id=cell)))
    assert pair.to_client() == [
        Answered(request_id=rid, result=Ok(value=ExecutionStarted(cell_id=cell)))
    ]
    return rid


def waited(outcome: WaitOutcome) -> Ok[HostResponse]:
    answer: Ok[HostResponse] = Ok(value=WaitCompleted(outcome=outcome))
    return answer


def tool_result(value: object) -> Ok[ToolResult | NotificationDelivered]:
    answer: Ok[ToolResult | NotificationDelivered] = Ok(value=ToolResult(result=value))
    return answer


# ---- handshake and ids -------------------------------------------------------------------


def test_handshake_offers_only_what_both_sides_list() -> None:
    pair = Pair()
    host_events, client_events = pair.flush()
    assert (
        host_events
        == client_events
        == [HandshakeCompleted(capabilities=frozenset({"session-cell-execution-resource-limits"}))]
    )
    assert pair.client.capabilities == pair.host.capabilities


def test_operations_before_the_handshake_are_refused_locally() -> None:
    pair = Pair()
    with pytest.raises(LocalProtocolError, match="handshake"):
        pair.client.open_session("s", None)


def test_request_history_is_bounded() -> None:
    pair = opened()
    encoder = FrameEncoder()
    shutdown = OperationRequest(id=1, request=ShutdownSession(session_id="s"))
    pair.host.receive_data(encoder.encode(shutdown))
    with pytest.raises(RemoteProtocolError, match=r"^duplicate code-mode request ID 1$"):
        pair.host.next_event()
    # Finished ids are remembered 4096 deep only: memory stays constant.
    host = HostConnection()
    host.receive_data(encoder.encode(Hello(supported_versions=[1])))
    host.next_event()
    for request_id in range(1, 5002):
        host.receive_data(
            encoder.encode(OperationRequest(id=request_id, request=Wait(
                session_id="none", request=WaitRequest(cell_id="1")
            )))
        )  # fmt: skip
        host.next_event()  # answered by the connection: unknown session
    assert host.statistics().requests == 0
    host.receive_data(
        encoder.encode(OperationRequest(id=1, request=ShutdownSession(session_id="x")))
    )
    host.next_event()  # id 1 is older than the 4096 last ones: accepted again
    host.data_to_send()


def test_execute_request_id_remains_active_until_initial_response() -> None:
    pair = opened()
    rid = start(pair)
    assert pair.host.statistics().requests == 1
    pair.client.take_initial(rid)
    pair.client.cancel(rid)
    assert pair.to_host() == [CancelRequested(request_id=rid)]
    pair.host.respond_initial(
        rid, Err(kind=ErrorKind.CANCELLED, message="code-mode request cancelled")
    )
    assert pair.host.statistics().requests == 0
    assert pair.to_client() == []  # retired: nothing was taken, nothing to hand on


def test_session_id_cannot_be_reused_after_shutdown() -> None:
    pair = opened()
    rid = pair.client.shutdown_session("s")
    (request,) = received(pair)
    pair.host.respond(request.request_id, Ok(value=SessionClosed(session_id="s")))
    pair.to_client()
    rid = pair.client.open_session("s", None)
    assert received(pair) == []  # answered by the host's connection, never by the runtime
    (answer,) = pair.to_client()
    assert answer == Answered(
        request_id=rid,
        result=Err(kind=ErrorKind.INVALID_REQUEST, message="code-mode session ID `s` was reused"),
    )


# ---- per-cell order ----------------------------------------------------------------------


def test_registration_queues_cell_closure_before_driver_starts() -> None:
    pair = opened()
    rid = start(pair)
    pair.host.cell_closed("s", "1")  # the runtime closed the cell before its initial response
    pair.host.respond_initial(rid, Ok(value=Completed(cell_id="1", content_items=[])))
    pair.client.take_initial(rid)
    events = pair.to_client()
    assert [type(f).__name__ for f in pair.host_frames[-2:]] == ["InitialResponse", "CellClosed"]
    assert events == [
        InitialAnswered(request_id=rid, result=Ok(value=Completed(cell_id="1", content_items=[]))),
        CellEnded(session_id="s", cell_id="1"),
    ]
    assert pair.host.statistics().routes == 0


def test_session_closed_waits_for_every_cell_closed() -> None:
    pair = opened()
    rid = start(pair)
    shutdown = pair.client.shutdown_session("s")
    (request,) = received(pair)
    pair.host.respond(request.request_id, Ok(value=SessionClosed(session_id="s")))
    assert pair.to_client() == []  # held back: cell 1 is still open
    pair.host.respond_initial(rid, Ok(value=Terminated(cell_id="1", content_items=[])))
    pair.host.cell_closed("s", "1")
    events = pair.to_client()
    assert [type(e).__name__ for e in events] == ["CellEnded", "Answered"]
    assert events[-1] == Answered(
        request_id=shutdown, result=Ok(value=SessionClosed(session_id="s"))
    )


def test_no_reverse_call_after_cell_closed() -> None:
    pair = opened()
    rid = start(pair)
    pair.host.respond_initial(rid, Ok(value=Completed(cell_id="1", content_items=[])))
    pair.host.cell_closed("s", "1")
    with pytest.raises(LocalProtocolError, match="code-mode cell is closed"):
        pair.host.call_client("s", "1", _invoke("1"))


# ---- retirement --------------------------------------------------------------------------


def test_cancelled_wait_is_retired_before_next_wait_is_sent() -> None:
    pair = opened()
    rid = start(pair)
    pair.client.release_initial(rid)
    pair.to_host()
    pair.host.respond_initial(rid, Err(kind=ErrorKind.CANCELLED, message="cancelled"))
    pair.to_client()
    first = pair.client.wait("s", "1", 60_000)
    pair.client.cancel(first)
    second = pair.client.wait("s", "1", 60_000)
    pair.to_host()
    frames = pair.client_frames[-2:]
    assert frames == [
        OperationRequest(
            id=first,
            request=Wait(session_id="s", request=WaitRequest(cell_id="1", yield_time_ms=60_000)),
        ),
        OperationCancel(id=first),
    ]  # the second wait waits for the first one's answer
    pair.host.respond(first, Err(kind=ErrorKind.CANCELLED, message="code-mode request cancelled"))
    assert pair.to_client() == []
    pair.to_host()
    assert pair.client_frames[-1] == OperationRequest(
        id=second,
        request=Wait(session_id="s", request=WaitRequest(cell_id="1", yield_time_ms=60_000)),
    )


def test_a_retired_wait_hands_its_output_to_the_next_observer() -> None:
    pair = opened()
    rid = start(pair)
    pair.client.release_initial(rid)
    pair.to_host()
    # The host had answered the initial observation before the cancel arrived.
    pair.host.respond_initial(rid, Ok(value=Yielded(cell_id="1", content_items=text("a"))))
    assert pair.to_client() == []  # parked, not dropped
    wait = pair.client.wait("s", "1", 10)
    pair.to_host()
    pair.host.respond(
        wait, waited(LiveCell(response=Yielded(cell_id="1", content_items=text("b"))))
    )
    assert pair.to_client() == [
        Answered(
            request_id=wait,
            result=waited(LiveCell(response=Yielded(cell_id="1", content_items=text("a", "b")))),
        )
    ]


def test_a_parked_completion_answers_the_next_wait_without_a_frame() -> None:
    pair = opened()
    rid = start(pair)
    pair.client.take_initial(rid)
    pair.to_host()
    pair.client.cancel(rid)
    pair.to_host()
    done = Completed(cell_id="1", content_items=text("x"))
    pair.host.respond_initial(rid, Ok(value=done))
    pair.host.cell_closed("s", "1")
    assert pair.to_client() == [CellEnded(session_id="s", cell_id="1")]
    sent = len(pair.client_frames)
    wait = pair.client.wait("s", "1", 10)
    assert pair.to_client() == [Answered(request_id=wait, result=waited(LiveCell(response=done)))]
    pair.to_host()
    assert len(pair.client_frames) == sent
    assert pair.client.statistics().cells == 0


def test_a_terminate_claims_a_parked_completion() -> None:
    pair = opened()
    rid = start(pair)
    pair.client.release_initial(rid)
    pair.to_host()
    done = Completed(cell_id="1", content_items=text("x"))
    pair.host.respond_initial(rid, Ok(value=done))
    pair.host.cell_closed("s", "1")
    pair.to_client()
    terminate = pair.client.terminate("s", "1")
    assert pair.to_client() == [
        Answered(request_id=terminate, result=waited(LiveCell(response=done)))
    ]


def test_a_terminate_answer_carries_parked_output_first() -> None:
    pair = opened()
    rid = start(pair)
    pair.client.release_initial(rid)
    terminate = pair.client.terminate("s", "1")
    pair.to_host()
    pair.host.respond_initial(rid, Ok(value=Yielded(cell_id="1", content_items=text("a"))))
    pair.host.respond(
        terminate, waited(LiveCell(response=Terminated(cell_id="1", content_items=text("b"))))
    )
    assert pair.to_client() == [
        Answered(
            request_id=terminate,
            result=waited(LiveCell(response=Terminated(cell_id="1", content_items=text("a", "b")))),
        )
    ]


def test_a_second_observer_or_terminate_is_refused_locally() -> None:
    pair = opened()
    rid = start(pair)  # the StartedCell holds the initial observation
    wait = pair.client.wait("s", "1", 10)
    first = pair.client.terminate("s", "1")
    second = pair.client.terminate("s", "1")
    events = pair.to_client()
    assert events == [
        Answered(
            request_id=wait,
            result=Err(
                kind=ErrorKind.OBSERVER_BUSY, message="exec cell 1 already has an active observer"
            ),
        ),
        Answered(
            request_id=second,
            result=Err(
                kind=ErrorKind.ALREADY_TERMINATING, message="exec cell 1 is already terminating"
            ),
        ),
    ]
    assert first not in [e.request_id for e in events if isinstance(e, Answered)]
    assert rid


def test_abandoned_execute_is_tracked_and_terminated_after_admission() -> None:
    pair = opened()
    rid = pair.client.execute("s", REQUEST)
    pair.client.cancel(rid)
    events = pair.to_host()
    assert [type(e).__name__ for e in events] == ["RequestReceived", "CancelRequested"]
    pair.host.respond(rid, Ok(value=ExecutionStarted(cell_id="1")))  # admitted all the same
    pair.to_client()
    pair.to_host()
    assert [type(f).__name__ for f in pair.client_frames[-3:]] == [
        "OperationRequest",
        "OperationCancel",
        "OperationRequest",
    ]
    terminate = pair.client_frames[-1]
    assert isinstance(terminate, OperationRequest)
    assert terminate.request == Terminate(session_id="s", cell_id="1")
    # The host ends the cell; the connection takes every answer without the caller.
    pair.host.respond_initial(rid, Err(kind=ErrorKind.CANCELLED, message="cancelled"))
    ended = Terminated(cell_id="1", content_items=[])
    pair.host.respond(terminate.id, waited(LiveCell(response=ended)))
    pair.host.cell_closed("s", "1")
    assert pair.to_client() == [CellEnded(session_id="s", cell_id="1")]
    assert pair.client.statistics().cells == 0
    assert pair.client.statistics().requests == 0


def test_delivered_but_unclaimed_execute_is_terminated_when_the_caller_is_cancelled() -> None:
    # In the sans-IO core an execute is "claimed" the moment its answer is an event: a cancel
    # that comes later concerns the cell's initial observation, not the execute. The trio
    # adapter hands that answer to its caller with no checkpoint in between, so a caller can
    # only be cancelled before the answer (terminated here) or after it has the cell id
    # (then the cell is the caller's: `test_wire_defects` checks both at random).
    pair = opened()
    rid = pair.client.execute("s", REQUEST)
    pair.to_host()
    pair.host.respond(rid, Ok(value=ExecutionStarted(cell_id="1")))
    pair.client.cancel(rid)  # the answer is still in flight: the caller goes away first
    pair.to_client()
    pair.to_host()
    assert pair.client_frames[-1] == OperationRequest(
        id=pair.client_frames[-1].id,  # type: ignore[union-attr]
        request=Terminate(session_id="s", cell_id="1"),
    )


def test_dropped_open_waiter_shuts_down_committed_session() -> None:
    pair = Pair()
    pair.flush()
    rid = pair.client.open_session("s", None)
    pair.client.cancel(rid)
    (request,) = received(pair)
    pair.host.respond(request.request_id, Ok(value=SessionReady(session_id="s")))
    pair.to_client()
    (shutdown,) = received(pair)
    assert shutdown.request == ShutdownSession(session_id="s")


# ---- reverse calls -----------------------------------------------------------------------


def _invoke(cell: str) -> ToolInvoke:
    return ToolInvoke(
        invocation=NestedToolCall(
            cell_id=cell,
            runtime_tool_call_id="tool-1",
            tool_name=ToolName.plain("t"),
            tool_kind=ToolKind.FUNCTION,
        )
    )


def test_delegate_cancel_is_best_effort_and_sends_no_late_response() -> None:
    pair = opened()
    start(pair)
    call = pair.host.call_client("s", "1", _invoke("1"))
    assert [type(e).__name__ for e in pair.to_client()] == ["DelegateRequested"]
    pair.host.cancel_call(call)
    pair.host.cancel_call(call)  # at most once
    assert pair.to_client() == [DelegateCancelled(call_id=call)]
    assert [type(f).__name__ for f in pair.host_frames].count("DelegateCancel") == 1
    assert pair.client.send_delegate_response(call, tool_result(1)) is False
    assert pair.client.data_to_send() == b""


def test_completed_delegate_request_id_cannot_be_reused() -> None:
    pair = opened()
    start(pair)
    call = pair.host.call_client("s", "1", _invoke("1"))
    pair.to_client()
    assert pair.client.send_delegate_response(call, tool_result(1))
    assert pair.to_host() == [DelegateAnswered(call_id=call, result=tool_result(1))]
    pair.client.receive_data(
        FrameEncoder().encode(DelegateRequest(id=call, session_id="s", request=_invoke("1")))
    )
    with pytest.raises(
        RemoteProtocolError, match=f"^duplicate code-mode delegate request ID {call}$"
    ):
        pair.client.next_event()


def test_delegate_for_unknown_cell_fails_connection_without_invocation() -> None:
    pair = opened()
    pair.client.receive_data(
        FrameEncoder().encode(DelegateRequest(id=1, session_id="s", request=_invoke("9")))
    )
    with pytest.raises(RemoteProtocolError, match="delegated for unknown cell 9 in session s"):
        pair.client.next_event()


def test_delegate_after_cell_close_fails_connection_without_invocation() -> None:
    pair = opened()
    rid = start(pair)
    pair.host.respond_initial(rid, Ok(value=Completed(cell_id="1", content_items=[])))
    pair.host.cell_closed("s", "1")
    pair.to_client()
    pair.client.receive_data(
        FrameEncoder().encode(DelegateRequest(id=7, session_id="s", request=_invoke("1")))
    )
    with pytest.raises(RemoteProtocolError, match="delegated for unknown cell 1"):
        pair.client.next_event()


def test_an_oversized_delegate_response_fails_only_that_call() -> None:
    pair = opened()
    start(pair)
    call = pair.host.call_client("s", "1", _invoke("1"))
    pair.to_client()
    assert pair.client.send_delegate_response(
        call, Ok(value=ToolResult(result="x" * MAX_FRAME_BYTES))
    )
    (answer,) = pair.to_host()
    assert isinstance(answer, DelegateAnswered)
    assert isinstance(answer.result, Err)
    assert answer.result.kind is ErrorKind.FRAME_LIMIT
    assert "code-mode delegate response exceeds the IPC frame limit" in answer.result.message


def test_an_oversized_reverse_call_raises_before_anything_is_queued() -> None:
    pair = opened()
    start(pair)
    big = ToolInvoke(invocation=NestedToolCall(
        cell_id="1", runtime_tool_call_id="tool-1", tool_name=ToolName.plain("t"),
        tool_kind=ToolKind.FREEFORM, input="x" * MAX_FRAME_BYTES,
    ))  # fmt: skip
    with pytest.raises(FrameTooLargeError):
        pair.host.call_client("s", "1", big)
    assert pair.host.data_to_send() == b""
    assert pair.host.statistics().calls == 0


def test_an_unencodable_delegate_answer_leaves_the_stream_whole() -> None:
    pair = opened()
    start(pair)
    call = pair.host.call_client("s", "1", _invoke("1"))
    pair.to_client()
    with pytest.raises(TypeError):
        pair.client.send_delegate_response(call, tool_result(object()))
    assert pair.client.send_delegate_response(call, Err(kind=ErrorKind.TOOL, message="no"))
    assert pair.to_host() == [
        DelegateAnswered(call_id=call, result=Err(kind=ErrorKind.TOOL, message="no"))
    ]


def test_notifications_are_answered_like_tool_calls() -> None:
    from codemode.protocol import NotificationSend

    pair = opened()
    start(pair)
    call = pair.host.call_client("s", "1", NotificationSend(call_id="c", cell_id="1", text="t"))
    (event,) = pair.to_client()
    assert isinstance(event, DelegateRequested)
    pair.client.send_delegate_response(call, Ok(value=NotificationDelivered()))
    assert pair.to_host() == [
        DelegateAnswered(call_id=call, result=Ok(value=NotificationDelivered()))
    ]


# ---- answers the client must refuse ------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "text_"),
    [
        (
            InitialResponse(id=2, result=Ok(value=Completed(cell_id="2", content_items=[]))),
            "initial response for cell 2 instead of 1",
        ),
        (
            OperationResponse(id=99, result=Ok(value=SessionReady(session_id="s"))),
            "unknown request ID 99",
        ),
    ],
    ids=["mismatched_initial_response_fails_connection", "unknown_request_id_fails_connection"],
)
def test_the_client_refuses_answers_that_break_the_rules(answer: object, text_: str) -> None:
    pair = opened()
    start(pair)
    pair.client.receive_data(FrameEncoder().encode(answer))
    with pytest.raises(RemoteProtocolError, match=text_):
        pair.client.next_event()


@pytest.mark.parametrize("operation", ["wait", "terminate"])
def test_mismatched_wait_or_terminate_response_fails_connection(operation: str) -> None:
    pair = opened()
    rid = start(pair)
    pair.client.release_initial(rid)
    pair.to_host()
    pair.host.respond_initial(rid, Err(kind=ErrorKind.CANCELLED, message="cancelled"))
    pair.to_client()
    request = (
        pair.client.wait("s", "1", 5) if operation == "wait" else pair.client.terminate("s", "1")
    )
    pair.client.receive_data(
        FrameEncoder().encode(OperationResponse(id=request, result=waited(missing_cell("7"))))
    )
    with pytest.raises(RemoteProtocolError, match="returned cell 7 for request targeting 1"):
        pair.client.next_event()


def test_connection_failure_closes_every_live_cell_once() -> None:
    pair = opened()
    start(pair, "1")
    start(pair, "2")
    assert sorted(pair.client.connection_lost()) == [("s", "1"), ("s", "2")]
    assert pair.client.connection_lost() == []
    assert pair.client.statistics().cells == 0


def test_session_accepts_more_than_4096_cells_without_growing_a_tombstone_set() -> None:
    pair = opened()
    for number in range(1, 5001):
        cell = str(number)
        rid = start(pair, cell)
        pair.client.take_initial(rid)
        done = Completed(cell_id=cell, content_items=[])
        pair.host.respond_initial(rid, Ok(value=done))
        pair.host.cell_closed("s", cell)
        assert pair.to_client() == [
            InitialAnswered(request_id=rid, result=Ok(value=done)),
            CellEnded(session_id="s", cell_id=cell),
        ]
    assert pair.client.statistics() == pair.client.statistics().__class__(
        requests=0, observations=0, cells=0, calls=0, sessions=1
    )
    assert pair.host.statistics().routes == 0
    assert pair.host.statistics().requests == 0
