"""The host program on the wire, and the process provider's handling of its process
(design.md, host 11: handshake, ordering, cancellation, frame limits, process lifetime)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

import codemode
from codemode import (
    CodeModeError,
    Completed,
    ExecuteRequest,
    InputText,
    LiveCell,
    Terminated,
    WaitRequest,
    Yielded,
)
from codemode.process._host_process import PIPE_BYTES, spawn_host
from codemode.protocol import (
    CLOSING_INITIAL_CAPABILITY,
    LIMITS_CAPABILITY,
    MAX_FRAME_BYTES,
    CellClosed,
    DelegateCancel,
    DelegateRequest,
    DelegateResponse,
    Err,
    ErrorKind,
    Execute,
    ExecutionStarted,
    FrameDecoder,
    FrameEncoder,
    Hello,
    HostMessage,
    InitialResponse,
    InvalidHello,
    MissingRequiredCapability,
    NoCompatibleVersion,
    NotificationDelivered,
    NotificationSend,
    Ok,
    OpenSession,
    OperationRequest,
    OperationResponse,
    Ready,
    Rejected,
    SessionClosed,
    SessionReady,
    ShutdownSession,
    Terminate,
    ToolInvoke,
    ToolResult,
    Wait,
    WaitCompleted,
)
from tests.delegates import RecordingDelegate
from tests.frames import receive_message
from tests.sessions import LONG_MS, run, texts, tool

pytestmark = pytest.mark.slow  # Every test runs a real host process.

HELLO = Hello(supported_versions=[1])
PIPE_MAX_SIZE = Path("/proc/sys/fs/pipe-max-size")


class RawClient:
    """A host process driven frame by frame."""

    def __init__(self, process: trio.Process) -> None:
        assert process.stdin is not None
        assert process.stdout is not None
        self.process = process
        self._stdin = process.stdin
        self._stdout = process.stdout
        self._encoder = FrameEncoder()
        self._decoder: FrameDecoder[HostMessage] = FrameDecoder(HostMessage)  # type: ignore[arg-type]
        self.stderr = b""

    async def send(self, message: object) -> None:
        await self._stdin.send_all(self._encoder.encode(message))

    async def send_raw(self, data: bytes) -> None:
        await self._stdin.send_all(data)

    async def receive(self) -> HostMessage:
        message = await receive_message(self._stdout, self._decoder)
        assert message is not None, "the host closed its stdout"
        return message

    async def receive_until_eof(self) -> list[HostMessage]:
        messages: list[HostMessage] = []
        while (message := await receive_message(self._stdout, self._decoder)) is not None:
            messages.append(message)
        return messages

    async def request(self, request_id: int, request: object) -> OperationResponse:
        await self.send(OperationRequest(id=request_id, request=request))  # type: ignore[arg-type]
        message = await self.receive()
        assert isinstance(message, OperationResponse), message
        assert message.id == request_id
        return message

    async def close_stdin(self) -> None:
        await self._stdin.aclose()

    async def _collect_stderr(self) -> None:
        assert self.process.stderr is not None
        while chunk := await self.process.stderr.receive_some(65536):
            self.stderr += chunk


@asynccontextmanager
async def raw_host(command: list[str] | None = None) -> AsyncIterator[RawClient]:
    process = await trio.lowlevel.open_process(
        command or codemode.default_host_command(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    client = RawClient(process)
    try:
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(client._collect_stderr)
                try:
                    yield client
                finally:
                    # EOF: the host shuts down and exits, which ends the stderr collector.
                    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                        await client.close_stdin()
    finally:
        if process.returncode is None:
            process.kill()
        with trio.CancelScope(shield=True):
            await process.wait()


async def handshake(client: RawClient, hello: Hello = HELLO) -> Ready:
    await client.send(hello)
    ready = await client.receive()
    assert isinstance(ready, Ready), ready
    return ready


# ---- handshake -----------------------------------------------------------------------------


async def test_handshake_and_multiple_session_lifecycles_are_ordered() -> None:
    async with raw_host() as client:
        assert await handshake(client) == Ready(
            selected_version=1, capabilities=[], admission=codemode.AdmissionLimits()
        )
        for request_id, session_id in ((1, "session-1"), (2, "session-2")):
            response = await client.request(request_id, OpenSession(session_id=session_id))
            assert response.result == Ok(value=SessionReady(session_id=session_id))
        for request_id, session_id in ((3, "session-1"), (4, "session-2")):
            response = await client.request(request_id, ShutdownSession(session_id=session_id))
            assert response.result == Ok(value=SessionClosed(session_id=session_id))
        await client.close_stdin()
        assert await client.receive_until_eof() == []
        assert await client.process.wait() == 0


@pytest.mark.parametrize(
    ("first", "reason"),
    [
        (Hello(supported_versions=[2]), NoCompatibleVersion(supported_versions=[1])),
        (
            OperationRequest(id=1, request=ShutdownSession(session_id="s")),
            InvalidHello(message="first message must be connection/hello"),
        ),
        (
            Hello(supported_versions=[1], required_capabilities=["teleportation"]),
            MissingRequiredCapability(capability="teleportation"),
        ),
    ],
    ids=["no-compatible-version", "invalid-hello", "missing-required-capability"],
)
async def test_incompatible_or_invalid_handshake_is_rejected(first: object, reason: object) -> None:
    async with raw_host() as client:
        await client.send(first)
        assert await client.receive() == Rejected(reason=reason)  # type: ignore[arg-type]
        assert await client.receive_until_eof() == []
        assert await client.process.wait() == 0


@pytest.mark.parametrize("listed_as", ["optional", "required"])
async def test_session_resource_limits_are_negotiated_when_optional_or_required(
    listed_as: str,
) -> None:
    hello = Hello(
        supported_versions=[1],
        optional_capabilities=[LIMITS_CAPABILITY] if listed_as == "optional" else [],
        required_capabilities=[LIMITS_CAPABILITY] if listed_as == "required" else [],
    )
    async with raw_host() as client:
        assert await handshake(client, hello) == Ready(
            selected_version=1,
            capabilities=[LIMITS_CAPABILITY],
            admission=codemode.AdmissionLimits(),
        )


async def test_host_exits_quietly_when_stdin_closes_before_the_handshake() -> None:
    async with raw_host() as client:
        await client.close_stdin()
        assert await client.receive_until_eof() == []
        assert await client.process.wait() == 0


async def test_a_second_hello_is_fatal() -> None:
    async with raw_host() as client:
        await handshake(client)
        await client.send(HELLO)
        assert await client.receive_until_eof() == []
        assert await client.process.wait() != 0
    assert b"received a second code-mode client hello" in client.stderr


async def test_an_oversized_incoming_frame_is_fatal_before_it_is_buffered() -> None:
    async with raw_host() as client:
        await handshake(client)
        await client.send_raw((MAX_FRAME_BYTES + 1).to_bytes(4, "little"))
        assert await client.receive_until_eof() == []
        assert await client.process.wait() != 0
    assert f"code-mode IPC frame length {MAX_FRAME_BYTES + 1} exceeds".encode() in client.stderr


async def test_session_id_cannot_be_reused_after_shutdown() -> None:
    async with raw_host() as client:
        await handshake(client)
        await client.request(1, OpenSession(session_id="session-1"))
        await client.request(2, ShutdownSession(session_id="session-1"))
        response = await client.request(3, OpenSession(session_id="session-1"))
        assert response.result == Err(
            kind=ErrorKind.INVALID_REQUEST, message="code-mode session ID `session-1` was reused"
        )
        response = await client.request(4, ShutdownSession(session_id="nope"))
        assert response.result == Err(
            kind=ErrorKind.INVALID_REQUEST, message="unknown code-mode session nope"
        )


# ---- ordering and reverse calls ------------------------------------------------------------


async def test_yield_notification_and_terminal_output_frames() -> None:
    source = (
        'setTimeout(() => {}, 60000); text("hello"); yield_control(); notify("note");'
        ' text("world");'
    )
    request = ExecuteRequest(tool_call_id="call-1", source=source, yield_time_ms=60_000)
    async with raw_host() as client:
        await handshake(client)
        await client.request(1, OpenSession(session_id="s"))
        await client.send(OperationRequest(id=2, request=Execute(session_id="s", request=request)))
        started = await client.receive()
        assert started == OperationResponse(id=2, result=Ok(value=ExecutionStarted(cell_id="1")))
        frames = [await client.receive(), await client.receive()]
        initial = next(f for f in frames if isinstance(f, InitialResponse))
        note = next(f for f in frames if isinstance(f, DelegateRequest))
        assert isinstance(initial.result, Ok)
        assert isinstance(initial.result.value, Yielded)
        assert initial.result.value.content_items == [InputText(text="hello")]
        assert note.request == NotificationSend(call_id="call-1", cell_id="1", text="note")
        await client.send(DelegateResponse(id=note.id, result=Ok(value=NotificationDelivered())))

        await client.send(
            OperationRequest(id=3, request=Wait(session_id="s", request=WaitRequest(cell_id="1")))
        )
        rest = [await client.receive(), await client.receive()]
        closed = CellClosed(session_id="s", cell_id="1")
        assert closed in rest  # before or after the wait's response: both orders are allowed
        (response,) = [m for m in rest if isinstance(m, OperationResponse)]
        assert isinstance(response.result, Ok)
        assert isinstance(response.result.value, WaitCompleted)
        outcome = response.result.value.outcome
        assert isinstance(outcome, LiveCell)
        assert isinstance(outcome.response, Completed)
        assert outcome.response.content_items == [InputText(text="world")]
        shutdown = await client.request(4, ShutdownSession(session_id="s"))
        assert shutdown.result == Ok(value=SessionClosed(session_id="s"))
        await client.close_stdin()
        assert await client.process.wait() == 0


async def test_termination_cancels_a_reverse_call_and_ignores_its_late_answer() -> None:
    request = ExecuteRequest(
        tool_call_id="c", source="await tools.t({})", enabled_tools=[tool("t")], yield_time_ms=0
    )
    async with raw_host() as client:
        await handshake(client)
        await client.request(1, OpenSession(session_id="s"))
        await client.send(OperationRequest(id=2, request=Execute(session_id="s", request=request)))
        seen = [await client.receive() for _ in range(3)]
        call = next(m for m in seen if isinstance(m, DelegateRequest))
        assert isinstance(call.request, ToolInvoke)
        assert call.request.invocation.runtime_tool_call_id == "tool-1"

        await client.send(OperationRequest(id=3, request=Terminate(session_id="s", cell_id="1")))
        rest = [await client.receive() for _ in range(3)]
        assert DelegateCancel(id=call.id) in rest
        assert CellClosed(session_id="s", cell_id="1") in rest
        # cell/closed comes after the cell's initial response (sent earlier).
        (response,) = [m for m in rest if isinstance(m, OperationResponse)]
        assert isinstance(response.result, Ok)
        assert isinstance(response.result.value, WaitCompleted)
        assert isinstance(response.result.value.outcome.response, Terminated)

        # A late answer to the cancelled call is dropped; the host keeps serving.
        await client.send(DelegateResponse(id=call.id, result=Ok(value=ToolResult(result=1))))
        shutdown = await client.request(4, ShutdownSession(session_id="s"))
        assert shutdown.result == Ok(value=SessionClosed(session_id="s"))


async def test_each_tool_answer_settles_its_own_call() -> None:
    # The host forwards tool calls without a task (runtime rule 6 of `_calls`): an error
    # answer rejects the promise with its text, an answer of the wrong kind with the host's own
    # text, a result resolves it, and a call too large for a frame fails alone.
    source = """
        const seen = [];
        for (const input of [1, 2, 3, "x".repeat(MAX)]) {
            try { seen.push(await tools.t({input})); } catch (e) { seen.push(String(e)); }
        }
        text(JSON.stringify(seen));
    """.replace("MAX", str(MAX_FRAME_BYTES))
    request = ExecuteRequest(
        tool_call_id="c", source=source, enabled_tools=[tool("t")], yield_time_ms=LONG_MS
    )
    answers: dict[object, Ok[ToolResult | NotificationDelivered] | Err] = {
        1: Err(kind=ErrorKind.TOOL, message="no such thing"),
        2: Ok(value=NotificationDelivered()),
        3: Ok(value=ToolResult(result={"ok": 3})),
    }
    with trio.fail_after(60):
        async with raw_host() as client:
            await handshake(client)
            await client.request(1, OpenSession(session_id="s"))
            execute = Execute(session_id="s", request=request)
            await client.send(OperationRequest(id=2, request=execute))
            while not isinstance(frame := await client.receive(), InitialResponse):
                if isinstance(frame, DelegateRequest):
                    assert isinstance(frame.request, ToolInvoke)
                    call_input = frame.request.invocation.input
                    assert isinstance(call_input, dict)
                    answer = answers[call_input["input"]]
                    await client.send(DelegateResponse(id=frame.id, result=answer))
            assert isinstance(frame.result, Ok)
            assert isinstance(frame.result.value, Completed)
            (item,) = frame.result.value.content_items
            assert isinstance(item, InputText)
            seen = json.loads(item.text)
            assert seen[:3] == [
                "no such thing",
                "code-mode client returned an invalid tool result",
                {"ok": 3},
            ]
            assert seen[3].startswith("code-mode IPC frame length"), seen[3]
            assert await client.receive() == CellClosed(session_id="s", cell_id="1")
            shutdown = await client.request(3, ShutdownSession(session_id="s"))
            assert shutdown.result == Ok(value=SessionClosed(session_id="s"))


async def test_cell_closed_is_never_sent_before_the_initial_response() -> None:
    request = ExecuteRequest(tool_call_id="c", source='text("quick")')
    async with raw_host() as client:
        await handshake(client)
        await client.request(1, OpenSession(session_id="s"))
        await client.send(OperationRequest(id=2, request=Execute(session_id="s", request=request)))
        frames = [await client.receive() for _ in range(3)]
        assert [type(f).__name__ for f in frames] == [
            "OperationResponse",
            "InitialResponse",
            "CellClosed",
        ]


async def test_a_cell_closed_at_its_initial_response_is_closed_by_it() -> None:
    # With `closing-initial-response`, the frame that ends most cells is one, not two.
    request = ExecuteRequest(tool_call_id="c", source='text("quick")')
    hello = Hello(supported_versions=[1], optional_capabilities=[CLOSING_INITIAL_CAPABILITY])
    async with raw_host() as client:
        ready = await handshake(client, hello)
        assert ready.capabilities == [CLOSING_INITIAL_CAPABILITY]
        await client.request(1, OpenSession(session_id="s"))
        await client.send(OperationRequest(id=2, request=Execute(session_id="s", request=request)))
        started = await client.receive()
        assert isinstance(started, OperationResponse)
        initial = await client.receive()
        assert isinstance(initial, InitialResponse)
        assert initial.closed
        assert isinstance(initial.result, Ok)
        assert isinstance(initial.result.value, Completed)
        # Nothing else is owed: the session closes at once.
        closed = await client.request(3, ShutdownSession(session_id="s"))
        assert closed.result == Ok(value=SessionClosed(session_id="s"))


async def test_a_wait_read_with_a_later_terminate_observes_the_termination() -> None:
    # Both requests arrive in one read: the wait, sent first, attaches before the terminate
    # takes effect, whatever order the host's scheduler runs their tasks in (ten cells: a
    # host that let the terminate go first half of the time fails this almost surely).
    source = "yield_control(); await new Promise(() => {})"
    encoder = FrameEncoder()
    async with raw_host() as client:
        await handshake(client)
        await client.request(1, OpenSession(session_id="s"))
        for round in range(10):
            cell_id = str(round + 1)
            execute, wait, terminate = 10 * round + 2, 10 * round + 3, 10 * round + 4
            request = ExecuteRequest(tool_call_id="c", source=source, yield_time_ms=LONG_MS)
            await client.send(
                OperationRequest(id=execute, request=Execute(session_id="s", request=request))
            )
            started = await client.receive()
            assert started == OperationResponse(
                id=execute, result=Ok(value=ExecutionStarted(cell_id=cell_id))
            )
            initial = await client.receive()
            assert isinstance(initial, InitialResponse), initial
            both = encoder.encode(
                OperationRequest(
                    id=wait,
                    request=Wait(session_id="s", request=WaitRequest(cell_id=cell_id)),
                )
            ) + encoder.encode(
                OperationRequest(id=terminate, request=Terminate(session_id="s", cell_id=cell_id))
            )
            await client.send_raw(both)
            frames = [await client.receive() for _ in range(3)]
            responses = {f.id: f.result for f in frames if isinstance(f, OperationResponse)}
            assert CellClosed(session_id="s", cell_id=cell_id) in frames
            assert sorted(responses) == [wait, terminate]
            for result in responses.values():
                assert isinstance(result, Ok), result
                assert isinstance(result.value, WaitCompleted), result
                outcome = result.value.outcome
                assert isinstance(outcome, LiveCell), outcome
                assert isinstance(outcome.response, Terminated), outcome
                assert outcome.response.cell_id == cell_id
                assert outcome.response.content_items == []


# ---- the process provider and its process ---------------------------------------------------

# The print comes from the engine's wrapper as a cell starts: an interpreted module, whose class
# a compiled host (docs/compiled.md) calls through its attributes, so the patch holds there too.
NOISY_HOST = """
import builtins, sys
from codemode_host.engine import Engine
original = Engine.start_cell
def noisy(self, *args, **kwargs):
    print("stray print on stdout", flush=True)
    return original(self, *args, **kwargs)
Engine.start_cell = noisy
from codemode_host.__main__ import main
main()
"""


async def test_stray_prints_never_corrupt_the_stream_and_reach_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="codemode.host")
    async with codemode.open_process_provider([sys.executable, "-c", NOISY_HOST]) as provider:
        session = await provider.create_session()
        delegate = RecordingDelegate()
        with trio.fail_after(10):
            response = await run(session, delegate, 'text("clean")')
            await session.shutdown()
    assert texts(response) == ["clean"]
    assert "code-mode host stderr: stray print on stdout" in caplog.text


async def test_handshake_timeout_kills_the_silent_host(tmp_path: Path) -> None:
    # The timeout itself is tested on the mock clock (test_client_timeouts.py); here, that
    # the real process it gave up on is killed and reaped by the time the error is raised.
    pid_path = tmp_path / "pid"
    # A shell writes its pid at once (well within the timeout), then becomes `sleep`.
    silent = ["sh", "-c", f"echo $$ > {pid_path}; exec sleep 60"]
    async with codemode.open_process_provider(silent, handshake_timeout=1.0) as provider:
        with trio.fail_after(10), pytest.raises(CodeModeError, match=r"^timed out negotiating"):
            await provider.create_session()
    assert _gone(_pid_of(pid_path))


async def test_a_host_that_cannot_be_spawned_is_reported() -> None:
    async with codemode.open_process_provider(["/nonexistent/codemode-host"]) as provider:
        with pytest.raises(
            CodeModeError, match=r"^failed to spawn code-mode host /nonexistent/codemode-host: "
        ):
            await provider.create_session()


def _pid_of(pid_path: Path) -> int:
    return int(pid_path.read_text().strip())


def _state(pid: int) -> str:
    """The process state letter (`R`, `S`, `Z`...), or `gone` once it was reaped."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return "gone"
    return status.rsplit(") ", 1)[1][0]


def _gone(pid: int) -> bool:
    """Reaped: neither running nor a zombie."""
    return _state(pid) in {"gone", "X"}


def _dead(pid: int) -> bool:
    """Not running (a zombie whose parent is gone waits for init to reap it)."""
    return _state(pid) in {"gone", "X", "Z"}


@pytest.mark.parametrize("ending", ["normal", "cancelled"])
async def test_no_zombie_or_orphan_host_is_left(tmp_path: Path, ending: str) -> None:
    from tests.test_seed_stdio import host_proxy

    proxy, pid_path = host_proxy(tmp_path)
    with trio.fail_after(20):
        with trio.CancelScope() as scope:
            async with codemode.open_process_provider([str(proxy)]) as provider:
                session = await provider.create_session()
                await run(session, RecordingDelegate(), "for (;;) {}", yield_time_ms=0)
                if ending == "cancelled":
                    scope.cancel()
                    await trio.sleep_forever()
        assert _gone(_pid_of(pid_path))


PARENT = """
import subprocess, sys
child = subprocess.Popen(sys.argv[1:], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
print(child.pid, flush=True)
sys.stdin.read()
"""


async def host_dies_with_its_parent(parent_script: str) -> None:
    """Run `parent_script`, which starts the host and prints its pid (then the pids of any
    helpers it started), kill it, and wait until the host is dead; helpers are killed after."""
    parent = await trio.lowlevel.open_process(
        [sys.executable, "-c", parent_script, *codemode.default_host_command()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    helpers: list[int] = []
    try:
        assert parent.stdout is not None
        with trio.fail_after(10):
            line = b""
            while not line.endswith(b"\n"):
                line += await parent.stdout.receive_some(64)
            host_pid, *helpers = map(int, line.split())
            parent.kill()
            await parent.wait()
            # The host is the parent's child, not ours: no event tells us it died, so poll
            # the kernel's view of it.
            while not _dead(host_pid):  # noqa: ASYNC110
                await trio.sleep(0.01)
    finally:
        if parent.returncode is None:
            parent.kill()
        for pid in helpers:
            os.kill(pid, signal.SIGKILL)
        with trio.CancelScope(shield=True):
            await parent.wait()


async def test_the_host_dies_with_its_parent() -> None:
    await host_dies_with_its_parent(PARENT)


async def test_each_session_reopens_on_one_new_host_after_a_loss(tmp_path: Path) -> None:
    from tests.test_seed_stdio import host_proxy

    proxy, pid_path = host_proxy(tmp_path)
    async with codemode.open_process_provider([str(proxy)]) as provider:
        first, second = await provider.create_session(), await provider.create_session()
        delegate = RecordingDelegate()
        with trio.fail_after(20):
            await run(first, delegate, "1")
            old_pid = _pid_of(pid_path)
            os.kill(old_pid, signal.SIGKILL)
            # The first operations may still see the dead host; one of them spawns the next.
            while _pid_of(pid_path) == old_pid:
                with contextlib.suppress(CodeModeError):
                    await run(first, delegate, "1")
            new_pid = _pid_of(pid_path)
            response = await run(second, delegate, 'text("again")')
            assert response.cell_id == "g2:1"
            assert _pid_of(pid_path) == new_pid
            await first.shutdown()
            await second.shutdown()


async def test_process_provider_leaves_no_file_descriptors(tmp_path: Path) -> None:
    from tests.test_seed_stdio import host_proxy

    def fds() -> int:
        import gc

        gc.collect()
        return len(os.listdir("/proc/self/fd"))

    proxy, pid_path = host_proxy(tmp_path)
    async with codemode.open_process_provider([str(proxy)]):
        pass
    before = fds()
    with trio.fail_after(20):
        async with codemode.open_process_provider([str(proxy)]) as provider:
            session = await provider.create_session()
            await run(session, RecordingDelegate(), "1")
            os.kill(_pid_of(pid_path), signal.SIGKILL)  # a lost host is cleaned up too
            while True:
                try:
                    await run(session, RecordingDelegate(), "1")
                    break
                except CodeModeError:
                    pass
    assert fds() == before


async def test_an_execute_abandoned_before_admission_leaves_the_session_usable() -> None:
    async with codemode.open_process_provider() as provider:
        session = await provider.create_session()
        delegate = RecordingDelegate()
        with trio.fail_after(10):
            # Cancelled while its request is in flight: the cell, once admitted, is terminated.
            with trio.move_on_after(0):
                await session.execute(
                    ExecuteRequest(tool_call_id="c", source="for (;;) {}"), delegate
                )
            response = await run(session, delegate, 'text("usable")')
            assert texts(response) == ["usable"]
            if response.cell_id == "2":
                # The abandoned execute reached the host: its spinning cell was terminated.
                await delegate.until(lambda: "1" in delegate.closed)
            else:
                assert response.cell_id == "1"  # cancelled before its frame was sent
            await session.shutdown()


STUCK_HOST = """
import trio
from codemode_host.runtime import RuntimeSession
async def never_answers(self):
    await trio.sleep_forever()
RuntimeSession.shutdown = never_answers
from codemode_host.__main__ import main
main()
"""


async def test_a_host_stuck_in_shutdown_is_killed_after_the_shutdown_timeout() -> None:
    # The timeout itself is tested on the mock clock (test_client_timeouts.py); here, with a
    # real host whose runtime never finishes a shutdown, that its process is killed and reaped.
    delegate = RecordingDelegate()
    with trio.fail_after(10):
        async with codemode.open_process_provider(
            [sys.executable, "-c", STUCK_HOST], shutdown_timeout=0.5
        ) as provider:
            session = await provider.create_session()
            await run(session, delegate, "await new Promise(() => {})", yield_time_ms=0)
            (host,) = provider.statistics().hosts
            assert host.pid is not None
    # The kill failed the session's shutdown, and its live cell was closed all the same.
    assert delegate.closed == ["1"]
    assert _gone(host.pid)


async def test_the_host_has_a_process_group_of_its_own_in_the_callers_session() -> None:
    # Ctrl-C in a terminal signals the application's process group, not the host's; and in
    # the application's session, the host shares its scheduling group (autogroup).
    with trio.fail_after(30):
        process = await spawn_host([sys.executable, "-c", "import sys; sys.stdin.read()"])
        assert os.getpgid(process.pid) == process.pid != os.getpgid(0)
        assert os.getsid(process.pid) == os.getsid(0)
        assert process.stdin is not None
        await process.stdin.aclose()
        assert await process.wait() == 0
        for pipe in (process.stdout, process.stderr):
            assert pipe is not None
            await pipe.aclose()


async def test_the_host_pipes_have_a_megabyte_of_room() -> None:
    # A 16 MiB tool result crosses in 16 writes and wake-ups instead of 256.
    limit = int(PIPE_MAX_SIZE.read_text())  # noqa: ASYNC240 - a tiny /proc file
    if limit < PIPE_BYTES:
        pytest.skip(f"this system caps pipes at {limit} bytes")
    with trio.fail_after(30):
        process = await spawn_host([sys.executable, "-c", "import sys; sys.stdin.read()"])
        assert process.stdin is not None
        assert process.stdout is not None
        for pipe in (process.stdin, process.stdout):
            assert isinstance(pipe, trio.lowlevel.FdStream)
            assert fcntl.fcntl(pipe.fileno(), fcntl.F_GETPIPE_SZ) == PIPE_BYTES
        await process.stdin.aclose()
        assert await process.wait() == 0
        await process.stdout.aclose()
        assert process.stderr is not None
        await process.stderr.aclose()


ALLOCATOR_PROBE = """
import ctypes, sys
import trio
from codemode_host.__main__ import main

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd",
        "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
    )]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]

def mapped(size):
    # Whether glibc gave a block of `size` bytes a mapping of its own (given back at its free).
    before = libc.mallinfo2().hblks
    block = libc.malloc(size)
    answer = libc.mallinfo2().hblks - before
    libc.free(block)
    return answer

def kept(size):
    # Whether `size` bytes freed at the top of the main arena stayed in it (not trimmed); in
    # blocks of 100 KiB, which no threshold maps.
    blocks = [libc.malloc(100 << 10) for _ in range(size // (100 << 10))]
    grown = libc.mallinfo2().arena
    for block in reversed(blocks):
        libc.free(block)
    return int(libc.mallinfo2().arena > grown - size // 2)

def probe(*args):  # in place of the host's trio.run: what main() set up before it
    print("mapped", mapped(1 << 20), mapped(64 << 20), file=sys.stderr, flush=True)
    print("kept", kept(3 << 20), kept(12 << 20), file=sys.stderr, flush=True)
    return 0

if sys.argv[1:] == ["host"]:
    trio.run = probe
    sys.argv[1:] = []
    main()
else:
    probe()
"""


@pytest.mark.parametrize(
    ("how", "expected"), [("host", "mapped 0 1\nkept 1 0"), ("plain", "mapped 1 1\nkept 0 0")]
)
async def test_the_host_keeps_freed_cell_memory_in_its_arenas(how: str, expected: str) -> None:
    # glibc gives a 1 MiB block a mapping of its own, unmapped at its free, and gives back
    # what is freed at an arena's top, until a large free raised its thresholds; the host
    # starts with them raised (a 64 MiB block is still mapped), and an arena still gives back
    # a large top (12 MiB), so that the host's memory goes back once its cells ended.
    with trio.fail_after(30):
        done = await trio.run_process(
            [sys.executable, "-c", ALLOCATOR_PROBE, how], capture_stderr=True, check=False
        )
    assert done.returncode == 0, done.stderr
    assert expected in done.stderr.decode()
