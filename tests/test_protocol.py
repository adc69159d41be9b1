"""The wire protocol and its sans-IO codec (design.md, host 2; design.md, design 3)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import codemode
from codemode import (
    AdmissionLimits,
    CellInfo,
    CellLimits,
    Completed,
    ExecuteRequest,
    ImageDetail,
    InputImage,
    InputText,
    LiveCell,
    MissingCell,
    NestedToolCall,
    Pending,
    Terminated,
    ToolDefinition,
    ToolKind,
    ToolName,
    WaitRequest,
    Yielded,
)
from codemode.protocol import (
    MAX_FRAME_BYTES,
    NEED_DATA,
    CellClosed,
    CellList,
    ClientMessage,
    DelegateCancel,
    DelegateRequest,
    DelegateResponse,
    Err,
    ErrorKind,
    Execute,
    ExecuteToPending,
    ExecutionStarted,
    FrameDecodeError,
    FrameDecoder,
    FrameEncoder,
    FrameLengthError,
    FrameTooLargeError,
    Hello,
    HostMessage,
    InitialResponse,
    InvalidHello,
    ListCells,
    LocalProtocolError,
    MissingRequiredCapability,
    NoCompatibleVersion,
    NotificationDelivered,
    NotificationSend,
    Ok,
    OpenSession,
    OperationCancel,
    OperationRequest,
    OperationResponse,
    OperationYield,
    ProtocolError,
    Ready,
    Rejected,
    RemoteProtocolError,
    SessionClosed,
    SessionReady,
    ShutdownSession,
    Terminate,
    ToolInvoke,
    ToolResult,
    Wait,
    WaitCompleted,
    WaitToPending,
)

TOOL = ToolDefinition(
    name="echo",
    tool_name=ToolName.namespaced("mcp__x__", "echo"),
    description="d",
    kind=ToolKind.FREEFORM,
    input_schema={"type": "object"},
)
CALL = NestedToolCall(
    cell_id="1",
    runtime_tool_call_id="tool-1",
    tool_name=ToolName.plain("echo"),
    tool_kind=ToolKind.FUNCTION,
    input={"n": 9007199254740991, "s": "a\u0000b"},
)

CLIENT_MESSAGES: list[object] = [
    Hello(supported_versions=[1], optional_capabilities=["session-cell-execution-resource-limits"]),
    OperationRequest(
        id=1,
        request=OpenSession(
            session_id="session-1", cell_execution_limits=CellLimits(max_yield_time_ms=5)
        ),
    ),
    OperationRequest(
        id=2,
        request=Execute(
            session_id="session-1",
            request=ExecuteRequest(
                tool_call_id="call-1", source="text(1)", enabled_tools=[TOOL], yield_time_ms=25
            ),
        ),
    ),
    OperationRequest(
        id=3, request=Wait(session_id="s", request=WaitRequest(cell_id="1", yield_time_ms=50))
    ),
    OperationRequest(id=4, request=Terminate(session_id="s", cell_id="1")),
    OperationRequest(id=5, request=ShutdownSession(session_id="s")),
    OperationCancel(id=2),
    OperationRequest(id=9, request=OpenSession(session_id="s", store_load=False)),
    OperationRequest(
        id=10,
        request=ExecuteToPending(
            session_id="s", request=ExecuteRequest(tool_call_id="call-2", source="text(2)")
        ),
    ),
    OperationRequest(id=11, request=WaitToPending(session_id="s", cell_id="1")),
    OperationRequest(id=12, request=ListCells(session_id="s")),
    OperationYield(id=3),
    DelegateResponse(id=6, result=Ok(value=ToolResult(result={"answer": 42}))),
    DelegateResponse(id=7, result=Ok(value=NotificationDelivered())),
    DelegateResponse(id=8, result=Err(kind=ErrorKind.TOOL, message="tool failed")),
]

HOST_MESSAGES: list[object] = [
    Ready(selected_version=1, capabilities=[]),
    Ready(selected_version=1, capabilities=[], admission=AdmissionLimits(max_active_cells=4)),
    OperationResponse(
        id=12,
        result=Ok(
            value=CellList(
                cells=[
                    CellInfo(
                        cell_id="1",
                        phase="running",
                        age_s=0.5,
                        pending_tool_calls=2,
                        buffered_output_bytes=70,
                        cpu_time_ms=1.5,
                    )
                ]
            )
        ),
    ),
    Rejected(reason=NoCompatibleVersion(supported_versions=[1])),
    Rejected(reason=MissingRequiredCapability(capability="x")),
    Rejected(reason=InvalidHello(message="first message must be connection/hello")),
    OperationResponse(id=1, result=Ok(value=SessionReady(session_id="session-1"))),
    OperationResponse(id=2, result=Ok(value=ExecutionStarted(cell_id="1"))),
    OperationResponse(
        id=3,
        result=Ok(
            value=WaitCompleted(
                outcome=LiveCell(
                    response=Yielded(
                        cell_id="1",
                        content_items=[
                            InputText(text="hello"),
                            InputImage(image_url="data:,", detail=ImageDetail.ORIGINAL),
                        ],
                        host_duration=0.5,
                    )
                )
            )
        ),
    ),
    OperationResponse(
        id=4,
        result=Ok(
            value=WaitCompleted(
                outcome=MissingCell(
                    response=Completed(
                        cell_id="9", content_items=[], error_text="exec cell 9 not found"
                    )
                )
            )
        ),
    ),
    OperationResponse(id=5, result=Ok(value=SessionClosed(session_id="s"))),
    OperationResponse(
        id=6, result=Err(kind=ErrorKind.INVALID_REQUEST, message="unknown code-mode session s")
    ),
    InitialResponse(id=2, result=Ok(value=Terminated(cell_id="1", content_items=[]))),
    InitialResponse(id=8, result=Err(kind=ErrorKind.INTERNAL, message="execution failed")),
    InitialResponse(
        id=10,
        result=Ok(
            value=Pending(
                cell_id="1",
                content_items=[InputText(text="before")],
                pending_tool_call_ids=["tool-1", "tool-2"],
                host_duration=0.25,
            )
        ),
    ),
    OperationResponse(
        id=11,
        result=Ok(
            value=WaitCompleted(
                outcome=LiveCell(
                    response=Pending(cell_id="1", content_items=[], pending_tool_call_ids=[])
                )
            )
        ),
    ),
    DelegateRequest(id=10, session_id="s", request=ToolInvoke(invocation=CALL)),
    DelegateRequest(
        id=11,
        session_id="s",
        request=NotificationSend(call_id="call-1", cell_id="1", text="important"),
    ),
    DelegateCancel(id=11),
    CellClosed(session_id="s", cell_id="1"),
]


def frames_of(messages: list[object]) -> bytes:
    encoder = FrameEncoder()
    return b"".join(encoder.encode(message) for message in messages)


def decode_all(decoder: FrameDecoder[object]) -> list[object]:
    out = []
    while (message := decoder.next_message()) is not NEED_DATA:
        out.append(message)
    return out


@pytest.mark.parametrize(
    ("messages", "union"),
    [(CLIENT_MESSAGES, ClientMessage), (HOST_MESSAGES, HostMessage)],
    ids=["client-to-host", "host-to-client"],
)
def test_every_message_round_trips(messages: list[object], union: object) -> None:
    decoder: FrameDecoder[object] = FrameDecoder(union)  # type: ignore[arg-type]
    decoder.receive_data(frames_of(messages))
    assert decode_all(decoder) == messages
    assert decoder.buffered == 0


def test_byte_by_byte_and_trailing_bytes() -> None:
    data = frames_of(HOST_MESSAGES)
    decoder: FrameDecoder[object] = FrameDecoder(HostMessage)  # type: ignore[arg-type]
    decoded: list[object] = []
    for i in range(len(data)):
        decoder.receive_data(data[i : i + 1])
        decoded += decode_all(decoder)
    assert decoded == HOST_MESSAGES
    decoder.receive_data(b"\x05\x00")
    assert decoder.next_message() is NEED_DATA
    assert decoder.buffered == 2


@settings(max_examples=200, deadline=None)
@given(
    indices=st.lists(st.integers(0, len(HOST_MESSAGES) - 1), max_size=20),
    cuts=st.lists(st.integers(0, 4096), max_size=30),
)
def test_any_frame_sequence_cut_anywhere_decodes_the_same(
    indices: list[int], cuts: list[int]
) -> None:
    messages = [HOST_MESSAGES[i] for i in indices]
    data = frames_of(messages)
    points = sorted({min(c, len(data)) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    decoder: FrameDecoder[object] = FrameDecoder(HostMessage)  # type: ignore[arg-type]
    decoded: list[object] = []
    for chunk in chunks:
        decoder.receive_data(chunk)
        decoded += decode_all(decoder)
    assert decoded == messages


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=512))
def test_random_bytes_raise_only_protocol_errors(data: bytes) -> None:
    decoder: FrameDecoder[object] = FrameDecoder(ClientMessage)  # type: ignore[arg-type]
    decoder.receive_data(data)
    try:
        decode_all(decoder)
    except ProtocolError:
        pass


def test_declared_length_is_checked_before_the_payload_arrives() -> None:
    decoder: FrameDecoder[object] = FrameDecoder(HostMessage)  # type: ignore[arg-type]
    decoder.receive_data((MAX_FRAME_BYTES + 1).to_bytes(4, "little"))
    with pytest.raises(
        FrameLengthError, match=f"^code-mode IPC frame length {MAX_FRAME_BYTES + 1} exceeds"
    ) as raised:
        decoder.next_message()
    assert isinstance(raised.value, RemoteProtocolError)


def test_a_payload_of_exactly_the_limit_is_allowed() -> None:
    decoder: FrameDecoder[object] = FrameDecoder(HostMessage)  # type: ignore[arg-type]
    decoder.receive_data(MAX_FRAME_BYTES.to_bytes(4, "little"))
    assert decoder.next_message() is NEED_DATA


@pytest.mark.parametrize("size", [10, 64 * 1024 - 200, 64 * 1024, 3 * 1024 * 1024])
def test_small_and_large_payloads_decode_alike(size: int) -> None:
    """Small payloads are decoded from a copy, large ones in place (`_codec`): either way a
    frame decodes to its message, a bad one names its problem and hands its payload back, and
    the buffer stays usable (a view left unreleased would refuse the next bytes)."""
    good = DelegateResponse(id=7, result=Ok(value=ToolResult(result="x" * size)))
    bad = {"type": "delegate/response", "id": 8, "result": "y" * size}
    decoder: FrameDecoder[object] = FrameDecoder(ClientMessage)  # type: ignore[arg-type]
    frames = FrameEncoder().encode(good) + _framed(bad) + FrameEncoder().encode(good)
    middle = len(frames) // 2
    decoder.receive_data(frames[:middle])
    assert decoder.next_message() == good
    decoder.receive_data(frames[middle:])
    with pytest.raises(FrameDecodeError, match=r"at `\$\.result`") as raised:
        decoder.next_message()
    assert msgspec.msgpack.decode(raised.value.payload) == bad
    assert decoder.next_message() == good
    assert decoder.next_message() is NEED_DATA
    assert decoder.buffered == 0


def test_oversized_messages_are_refused_by_the_encoder() -> None:
    message = DelegateResponse(id=1, result=Ok(value=ToolResult(result="x" * MAX_FRAME_BYTES)))
    with pytest.raises(FrameTooLargeError, match="exceeds 67108864 bytes") as raised:
        FrameEncoder().encode(message)
    # Our own message: a local refusal, not the peer's fault.
    assert isinstance(raised.value, LocalProtocolError)


@pytest.mark.parametrize(
    "payload",
    [
        {"type": "operation/cancel", "id": 1, "extra": True},
        {
            "type": "operation/request",
            "id": 1,
            "request": {"method": "session/shutdown", "session_id": "s", "extra": 1},
        },
        {
            "type": "operation/request",
            "id": 1,
            "request": {
                "method": "session/wait",
                "session_id": "s",
                "request": {"cell_id": "1", "yield_time_ms": 1, "extra": 1},
            },
        },
        {
            "type": "delegate/response",
            "id": 1,
            "result": {"status": "ok", "value": {"type": "notification/delivered", "x": 1}},
        },
        {"type": "connection/hello"},
        {"type": "no/such/type"},
    ],
)
def test_unknown_fields_and_types_are_rejected_at_every_level(payload: dict[str, object]) -> None:
    body = msgspec.msgpack.encode(payload)
    decoder: FrameDecoder[object] = FrameDecoder(ClientMessage)  # type: ignore[arg-type]
    decoder.receive_data(len(body).to_bytes(4, "little") + body)
    with pytest.raises(FrameDecodeError, match=r"^failed to decode code-mode IPC frame: "):
        decoder.next_message()


@pytest.mark.slow
def test_the_protocol_package_does_no_io() -> None:
    code = "import codemode.protocol, sys; print(sorted(m for m in ('trio', 'socket', 'asyncio') if m in sys.modules))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def _framed(payload: dict[str, object]) -> bytes:
    body = msgspec.msgpack.encode(payload)
    return len(body).to_bytes(4, "little") + body


def test_execute_request_integer_bounds_are_enforced() -> None:
    for value in (-1, 2**31):
        with pytest.raises(codemode.InvalidRequestError, match="max_output_tokens"):
            ExecuteRequest(tool_call_id="c", source="x", max_output_tokens=value)
        decoder: FrameDecoder[object] = FrameDecoder(ClientMessage)  # type: ignore[arg-type]
        request = {"tool_call_id": "c", "source": "x", "max_output_tokens": value}
        decoder.receive_data(_framed({
            "type": "operation/request", "id": 1,
            "request": {"method": "session/execute", "session_id": "s", "request": request},
        }))  # fmt: skip
        with pytest.raises(FrameDecodeError, match="max_output_tokens"):
            decoder.next_message()
    with pytest.raises(codemode.InvalidRequestError, match="yield_time_ms"):
        WaitRequest(cell_id="1", yield_time_ms=-1)
    assert ExecuteRequest(tool_call_id="c", source="x", max_output_tokens=2**31 - 1)


INVALID_STATES: list[tuple[str, Callable[[], object], dict[str, object]]] = [
    (
        "empty session id",
        lambda: OpenSession(session_id=""),
        {
            "type": "operation/request",
            "id": 1,
            "request": {"method": "session/open", "session_id": ""},
        },
    ),
    (
        "empty session id of a frontier wait",
        lambda: WaitToPending(session_id="", cell_id="1"),
        {
            "type": "operation/request",
            "id": 1,
            "request": {"method": "session/waitToPending", "session_id": "", "cell_id": "1"},
        },
    ),
    (
        "yield of request id 0",
        lambda: OperationYield(id=0),
        {"type": "operation/yield", "id": 0},
    ),
    (
        "version 0",
        lambda: Hello(supported_versions=[0]),
        {"type": "connection/hello", "supported_versions": [0]},
    ),
    (
        "no version",
        lambda: Hello(supported_versions=[]),
        {"type": "connection/hello", "supported_versions": []},
    ),
    (
        "repeated version",
        lambda: Hello(supported_versions=[1, 1]),
        {"type": "connection/hello", "supported_versions": [1, 1]},
    ),
    (
        "blank capability",
        lambda: Hello(supported_versions=[1], optional_capabilities=[" "]),
        {"type": "connection/hello", "supported_versions": [1], "optional_capabilities": [" "]},
    ),
    (
        "repeated capability",
        lambda: Hello(supported_versions=[1], required_capabilities=["a", "a"]),
        {
            "type": "connection/hello",
            "supported_versions": [1],
            "required_capabilities": ["a", "a"],
        },
    ),
    (
        "required and optional",
        lambda: Hello(
            supported_versions=[1], required_capabilities=["a"], optional_capabilities=["a"]
        ),
        {
            "type": "connection/hello",
            "supported_versions": [1],
            "required_capabilities": ["a"],
            "optional_capabilities": ["a"],
        },
    ),
]


@pytest.mark.parametrize(
    ("build", "payload"),
    [case[1:] for case in INVALID_STATES],
    ids=[case[0] for case in INVALID_STATES],
)
def test_invalid_protocol_states_cannot_be_constructed_or_decoded(
    build: Callable[[], object], payload: dict[str, object]
) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 (each case has its own text)
        build()
    decoder: FrameDecoder[object] = FrameDecoder(ClientMessage)  # type: ignore[arg-type]
    decoder.receive_data(_framed(payload))
    with pytest.raises(FrameDecodeError):
        decoder.next_message()
