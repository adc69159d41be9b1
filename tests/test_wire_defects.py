"""Each defect of the wire issue, reproduced through the public API (on both providers where it
applies): the host's lifetime, lost output, wrapped exceptions, start failures, cancelled
shutdowns, retained sessions, frame order and validation, provider differences, and the
defects found by reading (a stopped host, answers left in the pipe, finalizers, frame limits,
abandoned executes).
"""

from __future__ import annotations

import gc
import os
import random
import signal
import subprocess
import sys
import threading
import weakref
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

import codemode
from codemode import (
    CellLimits,
    Completed,
    ExecuteRequest,
    HostLostError,
    InputText,
    LiveCell,
    Pending,
    ProviderClosedError,
    RuntimeResponse,
    Session,
    SessionShuttingDownError,
    Terminated,
    WaitRequest,
    Yielded,
)
from codemode.protocol import (
    DelegateRequest,
    DelegateResponse,
    Execute,
    ExecutionStarted,
    FrameDecoder,
    FrameEncoder,
    Hello,
    HostMessage,
    InitialResponse,
    NotificationDelivered,
    NotificationSend,
    Ok,
    OpenSession,
    OperationRequest,
    OperationResponse,
    Ready,
    SessionReady,
)
from tests.delegates import RecordingDelegate
from tests.frames import receive_message
from tests.sessions import LONG_MS, execute, texts, tool
from tests.test_host import host_dies_with_its_parent, raw_host
from tests.test_seed_stdio import host_proxy

PROVIDERS = ["in-process", pytest.param("process", marks=pytest.mark.slow)]


def open_provider(kind: str, **options: Any) -> AbstractAsyncContextManager[Any]:
    if kind == "in-process":
        return codemode.open_in_process_provider()
    return codemode.open_process_provider(**options)


@asynccontextmanager
async def session_of(kind: str) -> AsyncIterator[Session]:
    async with open_provider(kind) as provider:
        yield await provider.create_session()


def request(source: str, *, yield_time_ms: int | None = LONG_MS) -> ExecuteRequest:
    return ExecuteRequest(tool_call_id="call-1", source=source, yield_time_ms=yield_time_ms)


# ---- the host's lifetime -----------------------------------------------------------------


@pytest.mark.slow
async def test_a_host_started_from_a_thread_that_has_exited_still_answers() -> None:
    # The thread spawns the host, shakes hands with it (the host is up and watching its
    # parent), then exits. With a parent-death *signal* the host would die with the thread.
    spawned: list[subprocess.Popen[bytes]] = []

    def spawn_and_shake_hands() -> None:
        process = subprocess.Popen(
            codemode.default_host_command(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert process.stdin is not None
        assert process.stdout is not None
        process.stdin.write(FrameEncoder().encode(Hello(supported_versions=[1])))
        process.stdin.flush()
        length = int.from_bytes(process.stdout.read(4), "little")
        decoded = msgspec.msgpack.decode(process.stdout.read(length), type=HostMessage)
        assert isinstance(decoded, Ready)
        spawned.append(process)

    thread = threading.Thread(target=spawn_and_shake_hands)
    thread.start()
    thread.join()
    (process,) = spawned
    assert process.stdin is not None
    assert process.stdout is not None
    send = trio.lowlevel.FdStream(os.dup(process.stdin.fileno()))
    receive = trio.lowlevel.FdStream(os.dup(process.stdout.fileno()))
    encoder = FrameEncoder()
    decoder: FrameDecoder[HostMessage] = FrameDecoder(HostMessage)  # type: ignore[arg-type]
    try:
        with trio.fail_after(10):
            await send.send_all(
                encoder.encode(OperationRequest(id=1, request=OpenSession(session_id="s")))
            )
            opened = await receive_message(receive, decoder)
            assert opened == OperationResponse(id=1, result=Ok(value=SessionReady(session_id="s")))
            execute = Execute(session_id="s", request=request('text("still here")'))
            await send.send_all(encoder.encode(OperationRequest(id=2, request=execute)))
            started = await receive_message(receive, decoder)
            assert started == OperationResponse(
                id=2, result=Ok(value=ExecutionStarted(cell_id="1"))
            )
            initial = await receive_message(receive, decoder)
            assert isinstance(initial, InitialResponse)
            assert isinstance(initial.result, Ok)
            assert texts(initial.result.value) == ["still here"]
    finally:
        await send.aclose()
        await receive.aclose()
        process.stdin.close()
        process.stdout.close()
        process.kill()
        process.wait()


KEEPER_PARENT = """
import os, subprocess, sys
from codemode.protocol import FrameEncoder, Hello
read_end, write_end = os.pipe()
host = subprocess.Popen(sys.argv[1:], stdin=read_end, stdout=subprocess.PIPE)
keeper = subprocess.Popen(["sleep", "120"], pass_fds=[write_end])  # holds the host's stdin open
os.close(read_end)
os.write(write_end, FrameEncoder().encode(Hello(supported_versions=[1])))
host.stdout.read(4)  # the host answered: it is up and watching its parent
print(host.pid, keeper.pid, flush=True)
sys.stdin.read()
"""


@pytest.mark.slow
async def test_the_host_dies_with_its_parent_process_even_when_its_stdin_stays_open() -> None:
    await host_dies_with_its_parent(KEEPER_PARENT)


# ---- output under random cancellation ----------------------------------------------------

LINES = 3_000
PRINTER = f"""
for (let i = 0; i < {LINES}; i++) {{
    text(String(i));
    await new Promise((resolve) => setTimeout(resolve, 1));
}}
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", PROVIDERS)
async def test_no_output_is_lost_when_waits_are_cancelled_at_random(kind: str) -> None:
    seed = 20261201
    rng = random.Random(seed)
    received: list[str] = []
    ended = False

    def take(response: RuntimeResponse | Pending) -> None:
        nonlocal ended
        received.extend(texts(response))
        ended = not isinstance(response, Yielded)

    with trio.fail_after(60):
        async with session_of(kind) as session:
            started = await session.execute(request(PRINTER, yield_time_ms=2), RecordingDelegate())
            with trio.move_on_after(rng.uniform(0, 0.004)):
                take(await started.initial_response())
            while not ended:
                with trio.move_on_after(rng.uniform(0, 0.004)):
                    outcome = await session.wait(WaitRequest(cell_id="1", yield_time_ms=2))
                    take(outcome.response)
    assert received == [str(i) for i in range(LINES)], f"seed {seed}"


# ---- exceptions, start failures, shutdown, retained sessions -----------------------------


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_exceptions_leave_the_provider_block_unwrapped(kind: str) -> None:
    async def raise_my_own() -> None:
        async with open_provider(kind):
            raise KeyError("mine")

    async def execute_after_shutdown() -> None:
        async with open_provider(kind) as provider:
            session = await provider.create_session()
            await session.shutdown()
            await session.execute(request("text(1)"), RecordingDelegate())

    with trio.fail_after(20):
        with pytest.raises(KeyError, match="mine"):
            await raise_my_own()
        # The API's own errors too, so `except codemode.CodeModeError` catches them.
        with pytest.raises(codemode.CodeModeError) as caught:
            await execute_after_shutdown()
    assert type(caught.value) is SessionShuttingDownError


FAILING_HOST = """
import sys
sys.stderr.write("warming up\\n" + "noise " * 60_000 + "\\ncannot start: no licence for this machine\\n")
sys.exit(3)
"""

CHATTY_HOST = """
import runpy, sys
sys.stderr.write("x" * 300_000 + "\\n")  # more than a pipe holds, before the handshake
sys.stderr.flush()
sys.argv = ["codemode_host"]
runpy.run_module("codemode_host", run_name="__main__")
"""


@pytest.mark.slow
async def test_a_host_that_fails_to_start_says_why() -> None:
    with trio.fail_after(20):
        async with codemode.open_process_provider([sys.executable, "-c", FAILING_HOST]) as provider:
            with pytest.raises(HostLostError) as caught:
                await provider.create_session()
    message = str(caught.value)
    assert message.startswith("code-mode host exited during handshake with status 3")
    assert message.endswith("cannot start: no licence for this machine")


@pytest.mark.slow
async def test_a_host_that_writes_a_lot_to_stderr_before_the_handshake_still_starts() -> None:
    with trio.fail_after(20):
        async with codemode.open_process_provider([sys.executable, "-c", CHATTY_HOST]) as provider:
            session = await provider.create_session()
            started = await session.execute(request('text("up")'), RecordingDelegate())
            assert texts(await started.initial_response()) == ["up"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", PROVIDERS)
async def test_a_cancelled_shutdown_still_closes_every_cell(kind: str) -> None:
    delegate = RecordingDelegate()
    delegate.hold_tools = True
    delegate.slow_cleanup = trio.Event()
    with trio.fail_after(20):
        async with session_of(kind) as session:
            await execute(
                session,
                delegate,
                "await tools.slow({})",
                tools=[tool("slow")],
                observe_initial=False,
            )
            await delegate.until(lambda: len(delegate.invocations) == 1)
            first = trio.CancelScope()

            async def shut_down_once() -> None:
                with first:
                    await session.shutdown()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(shut_down_once)
                await delegate.until(lambda: delegate.cancelled_tools == ["tool-1"])
                first.cancel()
            assert first.cancelled_caught
            await session.shutdown()  # waits for the same shutdown, to its end
            assert delegate.closed == ["1"]
            delegate.slow_cleanup.set()


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_providers_forget_closed_sessions(kind: str) -> None:
    delegate = RecordingDelegate()
    with trio.fail_after(20):
        async with open_provider(kind) as provider:
            refs = []
            for _ in range(3):
                session = await provider.create_session()
                started = await session.execute(request("text(1)"), delegate)
                await started.initial_response()
                await session.shutdown()
                refs.append(weakref.ref(session))
                del session, started
            await trio.testing.wait_all_tasks_blocked()
            gc.collect()
            assert [ref() for ref in refs] == [None, None, None]


# ---- frame order and validation ----------------------------------------------------------


@pytest.mark.slow
async def test_explicit_yield_frame_precedes_notification_and_terminal_output_drops_timers() -> (
    None
):
    source = 'setTimeout(() => {}, 60000); text("hello"); yield_control(); notify("note"); text("world");'
    for _ in range(10):  # the order once was a matter of scheduling luck
        async with raw_host() as client:
            await client.send(Hello(supported_versions=[1]))
            assert isinstance(await client.receive(), Ready)
            await client.request(1, OpenSession(session_id="s"))
            execute_ = Execute(session_id="s", request=request(source, yield_time_ms=60_000))
            await client.send(OperationRequest(id=2, request=execute_))
            frames = [await client.receive() for _ in range(3)]
            assert frames[0] == OperationResponse(
                id=2, result=Ok(value=ExecutionStarted(cell_id="1"))
            )
            assert isinstance(frames[1], InitialResponse)
            assert frames[1].result == Ok(
                value=Yielded(
                    cell_id="1",
                    content_items=[InputText(text="hello")],
                    host_duration=frames[1].result.value.host_duration,  # type: ignore[union-attr]
                )
            )
            note = frames[2]
            assert isinstance(note, DelegateRequest)
            assert note.request == NotificationSend(call_id="call-1", cell_id="1", text="note")
            await client.send(
                DelegateResponse(id=note.id, result=Ok(value=NotificationDelivered()))
            )
            await client.close_stdin()
            assert await client.process.wait() == 0


@pytest.mark.slow
async def test_a_malformed_hello_fails_decoding_and_the_host_exits_with_an_error() -> None:
    hello = msgspec.msgpack.encode({"type": "connection/hello", "supported_versions": [1, 1]})
    async with raw_host() as client:
        await client.send_raw(len(hello).to_bytes(4, "little") + hello)
        assert await client.receive_until_eof() == []  # no rejection frame: a decode error
        assert await client.process.wait() == 1
    assert b"must not repeat" in client.stderr


# ---- providers that differed -------------------------------------------------------------


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_wait_and_terminate_after_shutdown_raise_shutting_down(kind: str) -> None:
    with trio.fail_after(20):
        async with session_of(kind) as session:
            await execute(
                session, RecordingDelegate(), "await new Promise(() => {})", observe_initial=False
            )
            await session.shutdown()
            with pytest.raises(SessionShuttingDownError):
                await session.wait(WaitRequest(cell_id="1"))
            with pytest.raises(SessionShuttingDownError):
                await session.terminate("1")
            assert not session.is_alive


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_a_released_started_cell_gives_all_its_output_to_the_next_wait(kind: str) -> None:
    delegate = RecordingDelegate()
    with trio.fail_after(20):
        async with session_of(kind) as session:
            async with await session.execute(
                request('text("a"); yield_control(); text("b"); notify("done")'), delegate
            ):
                pass  # released unawaited, whatever the cell did meanwhile
            await delegate.until(lambda: len(delegate.notifications) == 1)
            outcome = await session.wait(WaitRequest(cell_id="1"))
    assert isinstance(outcome, LiveCell)
    assert isinstance(outcome.response, Completed)
    assert texts(outcome) == ["a", "b"]


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_operations_after_the_provider_closed_raise_provider_closed(kind: str) -> None:
    with trio.fail_after(20):
        async with open_provider(kind) as provider:
            session = await provider.create_session()
        with pytest.raises(ProviderClosedError, match=r"^the code-mode provider is closed$"):
            await provider.create_session()
        with pytest.raises(ProviderClosedError):
            await session.execute(request("text(1)"), RecordingDelegate())
        assert not session.is_alive


# ---- found by reading --------------------------------------------------------------------


@pytest.mark.slow
async def test_a_stopped_host_leaves_every_caller_cancellable(tmp_path: Path) -> None:
    proxy, pid_path = host_proxy(tmp_path)
    with trio.fail_after(30):
        async with codemode.open_process_provider([str(proxy)]) as provider:
            session = await provider.create_session()
            started = await session.execute(
                request("await new Promise(() => {})", yield_time_ms=0), RecordingDelegate()
            )
            await started.initial_response()
            pid = int(pid_path.read_text())
            os.kill(pid, signal.SIGSTOP)
            try:
                with trio.move_on_after(0.2) as waited:
                    await session.wait(WaitRequest(cell_id="1"))
                assert waited.cancelled_caught
                # More than a pipe holds: the writer blocks on the stopped host, the caller not.
                big = request("//" + "x" * (4 << 20) + "\ntext(1)")
                with trio.move_on_after(0.2) as sent:
                    await session.execute(big, RecordingDelegate())
                assert sent.cancelled_caught
            finally:
                os.kill(pid, signal.SIGCONT)
            outcome = await session.terminate("1")
            assert isinstance(outcome, LiveCell)
            assert isinstance(outcome.response, Terminated)


ANSWER_THEN_EXIT_HOST = """
import os, sys
from codemode import Completed, InputText
from codemode.protocol import (
    NEED_DATA, Execute, ExecutionStarted, HostConnection, Ok, OpenSession, RequestReceived,
    SessionReady,
)
connection = HostConnection()
while True:
    data = os.read(0, 65536)
    connection.receive_data(data)
    while (event := connection.next_event()) is not NEED_DATA:
        if isinstance(event, RequestReceived) and isinstance(event.request, OpenSession):
            connection.respond(event.request_id, Ok(value=SessionReady(session_id=event.request.session_id)))
        elif isinstance(event, RequestReceived) and isinstance(event.request, Execute):
            session_id = event.request.session_id
            connection.respond(event.request_id, Ok(value=ExecutionStarted(cell_id="1")))
            done = Completed(cell_id="1", content_items=[InputText(text="last words")])
            connection.respond_initial(event.request_id, Ok(value=done))
            connection.cell_closed(session_id, "1")
            os.write(1, connection.data_to_send())
            os._exit(0)  # at once: the answers are still in the pipe
    os.write(1, connection.data_to_send())
"""


@pytest.mark.slow
async def test_answers_written_before_the_host_exits_reach_their_callers() -> None:
    delegate = RecordingDelegate()
    with trio.fail_after(20):
        async with codemode.open_process_provider(
            [sys.executable, "-c", ANSWER_THEN_EXIT_HOST]
        ) as provider:
            session = await provider.create_session()
            started = await session.execute(request("ignored"), delegate)
            response = await started.initial_response()
            await delegate.until(lambda: delegate.closed == ["1"])
    assert response == Completed(
        cell_id="1", content_items=[InputText(text="last words")], host_duration=None
    )


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_a_started_cell_dropped_in_another_thread_releases_its_cell(kind: str) -> None:
    delegate = RecordingDelegate()
    with trio.fail_after(20):
        async with session_of(kind) as session:
            holder = [
                await session.execute(
                    request('text("kept"); notify("ready"); await new Promise(() => {})'),
                    delegate,
                )
            ]
            # The last reference dies in a worker thread: its finalizer runs there and must
            # only schedule the release on the provider's trio thread.
            with pytest.warns(ResourceWarning):
                await trio.to_thread.run_sync(holder.clear)
            gc.collect()
            await delegate.until(lambda: len(delegate.notifications) == 1)
            outcome = await session.wait(WaitRequest(cell_id="1", yield_time_ms=1))
            await session.terminate("1")
    assert texts(outcome) == ["kept"]


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_output_past_the_pending_output_limit_throws_and_what_is_buffered_arrives(
    kind: str,
) -> None:
    # The pending output limit (at most 60 MiB) keeps every observation below the frame
    # limit: the text() that would pass it throws, what is buffered arrives in one response.
    source = """
        const big = "x".repeat(25 << 20);
        text(big + "1"); text(big + "2");
        try { text(big + "3"); } catch (e) { text(String(e)); }
    """
    limits = CellLimits(max_pending_output_bytes=60 << 20)
    with trio.fail_after(60):
        async with open_provider(kind) as provider:
            session = await provider.create_session(limits)
            started = await session.execute(request(source), RecordingDelegate())
            response = await started.initial_response()
    assert isinstance(response, Completed)
    assert response.error_text is None
    *bigs, error = texts(response)
    assert [text[-1] for text in bigs] == ["1", "2"]
    assert all(len(text) == (25 << 20) + 1 for text in bigs)
    assert error == (
        "Error: exec cell output exceeds its pending output limit of 62914560 bytes;"
        " the output so far is delivered when the cell is observed"
    )


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_an_execute_cancelled_at_random_never_leaks_a_cell(kind: str) -> None:
    rng = random.Random(7)
    delegate = RecordingDelegate()
    mine: list[str] = []
    with trio.fail_after(30):
        async with session_of(kind) as session:
            for _ in range(30):
                with trio.move_on_after(rng.uniform(0, 0.003)):
                    started = await session.execute(
                        request("await new Promise(() => {})"), delegate
                    )
                    mine.append(started.cell_id)
                    started.release()
            probe = await session.execute(request("text(1)"), delegate)
            admitted = [str(n) for n in range(1, int(probe.cell_id))]
            for cell_id in mine:
                await session.terminate(cell_id)
            # Every cell the caller never learned of was terminated for it.
            await delegate.until(lambda: set(admitted) <= set(delegate.closed))
            await probe.initial_response()
