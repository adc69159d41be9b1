"""Requests are checked before they reach the wire, and a bad body costs only its request.

The defect: a `ToolDefinition` built with a `ToolName` where the flat name belongs was encoded
and sent; the shared host failed to decode the frame and exited, so every other session of
that host lost its cells and stored values, and the caller got `HostLostError`. Now every
provider's session refuses it with `InvalidRequestError` naming the field, and a host that gets
such a body anyway (another client, a fuzzer) answers that request alone (docs/protocol.md,
"Requests are checked twice").
"""

from __future__ import annotations

import random
import re
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import pytest
import trio

import codemode
from codemode import (
    Completed,
    ExecuteRequest,
    InvalidRequestError,
    Session,
    ToolDefinition,
    ToolName,
    WaitRequest,
)
from codemode._checks import check_cell_id, check_execute, check_wait
from codemode.protocol import (
    DelegateRequest,
    Err,
    Execute,
    ExecutionStarted,
    FrameDecoder,
    FrameEncoder,
    Hello,
    HostMessage,
    InitialResponse,
    OpenSession,
    OperationRequest,
    OperationResponse,
    Ready,
    SessionReady,
    ToolInvoke,
)
from tests.conftest import Provider
from tests.delegates import RecordingDelegate
from tests.frames import receive_message
from tests.sessions import run, texts, tool


def _any(value: object) -> Any:
    """`value`, typed so that a test can build what the type checker would refuse."""
    return value


def _bad_tool() -> ToolDefinition:
    # What the issue found: the routing name where the flat name belongs.
    return ToolDefinition(name=ToolName.plain("x"), tool_name=ToolName.plain("x"))  # type: ignore[arg-type]


# ---- the checks themselves ------------------------------------------------------------------


def _request(**fields: Any) -> ExecuteRequest:
    return ExecuteRequest(**{"tool_call_id": "call", "source": "text(1)", **fields})


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (ExecuteRequest(tool_call_id=1, source="text(1)"), "tool_call_id must be a str, got int"),  # type: ignore[arg-type]
        (ExecuteRequest(tool_call_id="c", source=b"text(1)"), "source must be a str, got bytes"),  # type: ignore[arg-type]
        (_request(source="text('\ud83d')"), "source holds a lone surrogate ('\\ud83d' at index 6)"),
        (
            _request(enabled_tools=(tool("x"),)),
            "enabled_tools must be a list of ToolDefinition, got tuple",
        ),
        (_request(enabled_tools=["x"]), "enabled_tools[0] must be a ToolDefinition, got str"),
        (
            _request(enabled_tools=[_bad_tool()]),
            "enabled_tools[0].name must be a str, got ToolName",
        ),
        (
            _request(enabled_tools=[tool("a"), ToolDefinition(name="b", tool_name="b")]),  # type: ignore[arg-type]
            "enabled_tools[1].tool_name must be a ToolName, got str",
        ),
        (
            _request(
                enabled_tools=[
                    ToolDefinition(name="b", tool_name=ToolName(name="b", namespace=_any(3)))
                ]
            ),
            "enabled_tools[0].tool_name.namespace must be a str, got int",
        ),
        (
            _request(
                enabled_tools=[
                    ToolDefinition(name="b", tool_name=ToolName.plain("b"), description=_any(None))
                ]
            ),
            "enabled_tools[0].description must be a str, got NoneType",
        ),
        (
            _request(
                enabled_tools=[
                    ToolDefinition(name="b", tool_name=ToolName.plain("b"), kind=_any("python"))
                ]
            ),
            "enabled_tools[0].kind must be a ToolKind, got str",
        ),
        (
            _request(
                enabled_tools=[
                    ToolDefinition(name="b", tool_name=ToolName.plain("b"), input_schema="{}")
                ]
            ),
            "enabled_tools[0].input_schema must be a JSON object, a boolean or None, got str",
        ),
        (
            _request(
                enabled_tools=[
                    ToolDefinition(
                        name="b", tool_name=ToolName.plain("b"), output_schema={"default": object()}
                    )
                ]
            ),
            "enabled_tools[0].output_schema is not JSON",
        ),
        (WaitRequest(cell_id=1), "wait request: cell_id must be a str, got int"),  # type: ignore[arg-type]
        ("text(1)", "execute request: request must be an ExecuteRequest, got str"),
    ],
)
def test_each_wrong_field_is_named(request_: object, field: str) -> None:
    check = check_wait if isinstance(request_, WaitRequest) else check_execute
    with pytest.raises(InvalidRequestError, match=r"^invalid code-mode ") as raised:
        check(request_)
    assert field in str(raised.value)


@pytest.mark.parametrize(
    ("make", "text"),
    [
        (lambda: _request(yield_time_ms=1.5), "yield_time_ms must be an int, got float"),
        (lambda: _request(max_output_tokens="9"), "max_output_tokens must be an int, got str"),
        (
            lambda: WaitRequest(cell_id="1", yield_time_ms=True),
            "yield_time_ms must be an int, got bool",
        ),
        (lambda: _request(yield_time_ms=-1), "yield_time_ms must be between 0 and"),
    ],
)
def test_numbers_are_checked_at_construction(make: Any, text: str) -> None:
    with pytest.raises(InvalidRequestError, match=f"^{re.escape(text)}"):
        make()


def test_well_formed_requests_pass() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    check_execute(
        _request(
            source="text('héllo 👋')",
            enabled_tools=[
                tool("a"),
                ToolDefinition(
                    name="b", tool_name=ToolName.namespaced("ns", "b"), input_schema=schema
                ),
                ToolDefinition(
                    name="c",
                    tool_name=ToolName.plain("c"),
                    kind=_any("freeform"),
                    output_schema=True,
                ),
            ],
            yield_time_ms=0,
            max_output_tokens=10,
        )
    )
    check_execute(
        _request(
            enabled_tools=[
                ToolDefinition(name="b", tool_name=ToolName.plain("b"), input_schema=schema)
            ]
        )
    )
    check_wait(WaitRequest(cell_id="g2:1", yield_time_ms=0))
    check_cell_id("1")
    with pytest.raises(
        InvalidRequestError, match=r"^invalid code-mode cell id: expected a str, got int$"
    ):
        check_cell_id(1)


# ---- through every provider -----------------------------------------------------------------


async def test_a_bad_request_costs_neither_its_session_nor_another(provider: Provider) -> None:
    with trio.fail_after(30):
        delegate = RecordingDelegate()
        first = await provider.create_session()
        other = await provider.create_session()
        for session in (first, other):
            assert texts(await run(session, delegate, "store('k', 'kept'); text('ok')")) == ["ok"]
        request = ExecuteRequest(tool_call_id="call", source="text(1)", enabled_tools=[_bad_tool()])
        with pytest.raises(
            InvalidRequestError,
            match=r"^invalid code-mode execute request: enabled_tools\[0\]\.name must be a str, got ToolName$",
        ):
            await first.execute(request, delegate)
        with pytest.raises(InvalidRequestError, match="yield_time_ms must be an int, got str"):
            await first.wait(WaitRequest(cell_id="1", yield_time_ms="5"))  # type: ignore[arg-type]
        with pytest.raises(InvalidRequestError, match="cell id: expected a str, got int"):
            await first.terminate(1)  # type: ignore[arg-type]
        # Same host, same generation: the sessions and their stored values are all there.
        for session in (first, other):
            response = await run(session, delegate, "text(load('k'))")
            assert isinstance(response, Completed)
            assert texts(response) == ["kept"]
            assert response.cell_id == "2"


async def test_a_lone_surrogate_is_refused_the_same_way_everywhere(session: Session) -> None:
    with trio.fail_after(30):
        request = ExecuteRequest(tool_call_id="call", source="text('\ud800')")
        with pytest.raises(
            InvalidRequestError, match=r"source holds a lone surrogate \('\\ud800' at index 6\)"
        ):
            await session.execute(request, RecordingDelegate())
        assert texts(await run(session, RecordingDelegate(), "text('fine')")) == ["fine"]


# ---- a host that gets a bad body anyway -----------------------------------------------------

_encoder = FrameEncoder()


def _frame(message: object) -> bytes:
    return _encoder.encode(message)


def _raw(tree: object) -> bytes:
    payload = msgspec.msgpack.encode(tree)
    return len(payload).to_bytes(4, "little") + payload


class RawHost:
    """A real host process spoken to frame by frame, as another client (or a fuzzer) would."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.decoder: FrameDecoder[HostMessage] = FrameDecoder(HostMessage)  # type: ignore[arg-type]
        self.seen: list[HostMessage] = []

    async def send(self, data: bytes) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send_all(data)

    async def receive(self) -> HostMessage | None:
        assert self.process.stdout is not None
        return await receive_message(self.process.stdout, self.decoder)

    async def until(self, wanted: type, message_id: int) -> Any:
        """Read frames until the `wanted` message with `message_id`; the others are kept."""
        assert self.process.stdout is not None
        while True:
            message = await self.receive()
            assert message is not None, "the host closed the connection"
            self.seen.append(message)
            if isinstance(message, wanted) and getattr(message, "id", None) == message_id:
                return message


@asynccontextmanager
async def raw_host() -> AsyncIterator[tuple[RawHost, trio.Process]]:
    """A host process after its handshake; killed on the way out if it is still running."""
    process = await trio.lowlevel.open_process(
        codemode.default_host_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        host = RawHost(process)
        await host.send(_frame(Hello(supported_versions=[1])))
        assert process.stdout is not None
        assert isinstance(await host.receive(), Ready)
        yield host, process
    finally:
        if process.returncode is None:
            process.kill()
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            await process.wait()


async def _run_cell(host: RawHost, request_id: int, session_id: str, source: str) -> list[str]:
    request = ExecuteRequest(tool_call_id="call", source=source)
    await host.send(
        _frame(
            OperationRequest(id=request_id, request=Execute(session_id=session_id, request=request))
        )
    )
    started = await host.until(OperationResponse, request_id)
    assert started.result.value == ExecutionStarted(cell_id=started.result.value.cell_id), started
    initial = await host.until(InitialResponse, request_id)
    assert isinstance(initial.result.value, Completed), initial
    return texts(initial.result.value)


def _bad_execute(request_id: int, session_id: str) -> bytes:
    tree = msgspec.to_builtins(
        OperationRequest(
            id=request_id,
            request=Execute(
                session_id=session_id,
                request=ExecuteRequest(
                    tool_call_id="c", source="text(1)", enabled_tools=[tool("x")]
                ),
            ),
        )
    )
    tree["request"]["request"]["enabled_tools"][0]["name"] = {"name": "x"}
    return _raw(tree)


@pytest.mark.slow
async def test_the_host_answers_an_undecodable_request_and_serves_on() -> None:
    with trio.fail_after(30):
        async with raw_host() as (host, process):
            await host.send(_frame(OperationRequest(id=1, request=OpenSession(session_id="s"))))
            assert (await host.until(OperationResponse, 1)).result.value == SessionReady(
                session_id="s"
            )
            assert await _run_cell(host, 2, "s", "store('k', 'kept'); text('ok')") == ["ok"]

            await host.send(_bad_execute(3, "s"))
            answer = await host.until(OperationResponse, 3)
            assert isinstance(answer.result, Err)
            assert answer.result.kind == "invalid_request"
            assert answer.result.message.startswith(
                "invalid code-mode request: Expected `str`, got `object`"
            )
            assert "enabled_tools[0].name" in answer.result.message

            # The id is spent, as for any answered request: a repeat is a protocol error.
            assert await _run_cell(host, 4, "s", "text(load('k'))") == ["kept"]
            assert process.stdin is not None
            await process.stdin.aclose()
            assert await process.wait() == 0


@pytest.mark.slow
async def test_an_undecodable_delegate_answer_fails_that_call_only() -> None:
    with trio.fail_after(30):
        async with raw_host() as (host, process):
            await host.send(_frame(OperationRequest(id=1, request=OpenSession(session_id="s"))))
            await host.until(OperationResponse, 1)
            source = (
                "try { await tools.x({}) } catch (e) { text('rejected: ' + String(e)) }\n"
                "text('then ' + (await tools.x({})).ok)"
            )
            request = ExecuteRequest(tool_call_id="call", source=source, enabled_tools=[tool("x")])
            await host.send(
                _frame(OperationRequest(id=2, request=Execute(session_id="s", request=request)))
            )
            await host.until(OperationResponse, 2)
            first = await host.until(DelegateRequest, 1)
            assert isinstance(first.request, ToolInvoke)
            # A tool result with a field the schema does not have.
            await host.send(
                _raw(
                    {
                        "type": "delegate/response",
                        "id": 1,
                        "result": {
                            "status": "ok",
                            "value": {"type": "tool/result", "result": 1, "extra": 2},
                        },
                    }
                )
            )
            await host.until(DelegateRequest, 2)
            await host.send(
                _raw(
                    {
                        "type": "delegate/response",
                        "id": 2,
                        "result": {
                            "status": "ok",
                            "value": {"type": "tool/result", "result": {"ok": "yes"}},
                        },
                    }
                )
            )
            initial = await host.until(InitialResponse, 2)
            assert isinstance(initial.result.value, Completed), initial
            lines = texts(initial.result.value)
            assert lines[0].startswith(
                "rejected: code-mode delegate response did not decode: Object contains unknown field `extra`"
            ), lines
            assert lines[1] == "then yes"
            assert process.stdin is not None
            await process.stdin.aclose()
            assert await process.wait() == 0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("data", "why"),
    [
        (_raw({"type": "operation/unknown", "id": 5}), "an unknown type"),
        (_raw({"type": "operation/request", "request": {}}), "no id"),
        (_raw([1, 2, 3]), "not a map"),
        (b"\x03\x00\x00\x00\xc1\xc1\xc1", "not msgpack at all"),
    ],
)
async def test_other_undecodable_frames_stay_fatal(data: bytes, why: str) -> None:
    with trio.fail_after(30):
        async with raw_host() as (host, process):
            await host.send(data)
            assert await host.receive() is None, why
            assert await process.wait() == 1, why


@pytest.mark.slow
async def test_garbage_bodies_among_valid_traffic_cost_no_session_anything() -> None:
    """A fixed seed: bodies of requests and delegate answers with one field replaced by a
    random value, between the cells of two sessions on one shared host."""
    rng = random.Random(31)
    garbage_values: list[Any] = [
        None,
        True,
        -1,
        2**64 - 1,
        1.5,
        "",
        "x" * 40,
        b"\x00",
        [],
        [1, {}],
        {"a": 1},
    ]
    with trio.fail_after(60):
        async with raw_host() as (host, process):
            for index, session_id in enumerate(("a", "b"), start=1):
                await host.send(
                    _frame(OperationRequest(id=index, request=OpenSession(session_id=session_id)))
                )
                await host.until(OperationResponse, index)
            next_id = 10
            runs = {"a": 0, "b": 0}
            for round_ in range(60):
                session_id = rng.choice(("a", "b"))
                tree = msgspec.to_builtins(
                    OperationRequest(
                        id=next_id,
                        request=Execute(
                            session_id=session_id,
                            request=ExecuteRequest(
                                tool_call_id="c",
                                source="text(1)",
                                enabled_tools=[tool("x")],
                                yield_time_ms=5,
                            ),
                        ),
                    )
                )
                holder, key = rng.choice(
                    [
                        (tree["request"], "session_id"),
                        (tree["request"]["request"], "source"),
                        (tree["request"]["request"], "tool_call_id"),
                        (tree["request"]["request"], "yield_time_ms"),
                        (tree["request"]["request"]["enabled_tools"][0], "name"),
                        (tree["request"]["request"]["enabled_tools"][0], "tool_name"),
                        (tree["request"]["request"]["enabled_tools"][0]["tool_name"], "name"),
                        (tree["request"], "method"),
                    ]
                )
                holder[key] = rng.choice(garbage_values)
                try:
                    msgspec.msgpack.decode(msgspec.msgpack.encode(tree), type=OperationRequest)
                except (msgspec.DecodeError, InvalidRequestError):
                    pass
                else:
                    continue  # the replacement happened to be valid
                await host.send(_raw(tree))
                answer = await host.until(OperationResponse, next_id)
                assert isinstance(answer.result, Err), (round_, tree, answer)
                assert answer.result.kind == "invalid_request", answer
                next_id += 1
                if round_ % 5 == 0:
                    runs[session_id] += 1
                    source = f"store('n', {runs[session_id]}); text(String(load('n')))"
                    assert await _run_cell(host, next_id, session_id, source) == [
                        str(runs[session_id])
                    ]
                    next_id += 1
            for session_id in ("a", "b"):
                source = "text(String(load('n') ?? 'none'))"
                expected = str(runs[session_id]) if runs[session_id] else "none"
                assert await _run_cell(host, next_id, session_id, source) == [expected]
                next_id += 1
            assert process.stdin is not None
            await process.stdin.aclose()
            assert await process.wait() == 0
