"""Deadlines and budgets (docs/governance.md): a cell's wall-clock limit, a session's tool call
and CPU budgets and `Session.usage()`, with their exact texts, on every provider; the pause of
the wall-clock limit on trio's mock clock; the capabilities that carry them."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import cast

import msgspec
import pytest
import trio
import trio.testing
from codemode_host.engine import Engine
from codemode_host.runtime import RuntimeSession
from codemode_host.runtime._jswait import JavaScriptWait

import codemode
from codemode import (
    AdmissionError,
    CellLimits,
    Completed,
    ExecuteRequest,
    InputText,
    InvalidRequestError,
    JsonValue,
    LiveCell,
    NestedToolCall,
    Pending,
    SessionUsage,
    WaitRequest,
    Yielded,
)
from codemode._trio import Alarms
from codemode.protocol import (
    BUDGET_CAPABILITY,
    LIMITS_CAPABILITY,
    WALL_TIME_CAPABILITY,
    Answered,
    Err,
    ErrorKind,
    RequestReceived,
)
from tests.conftest import Provider
from tests.delegates import RecordingDelegate
from tests.protocol_pair import Pair
from tests.sessions import LONG_MS, execute, run, texts, tool

WALL_MS = 200
TIME_UP = f"exec cell exceeded its time limit of {WALL_MS} ms"


class OrderedDelegate(RecordingDelegate):
    """Records in order when each tool call returned (or was cancelled) and each cell closed."""

    def __init__(self) -> None:
        super().__init__()
        self.order: list[str] = []

    async def invoke_tool(self, call: NestedToolCall) -> JsonValue:
        try:
            return await super().invoke_tool(call)
        finally:
            self.order.append(f"returned {call.runtime_tool_call_id}")

    def cell_closed(self, cell_id: str) -> None:
        self.order.append(f"closed {cell_id}")
        super().cell_closed(cell_id)


async def loaded(session: codemode.Session) -> list[str]:
    return texts(await run(session, RecordingDelegate(), 'text(String(load("k")))'))


# ---- the wall-clock limit ------------------------------------------------------------------


async def test_a_cell_waiting_on_a_tool_past_its_wall_time_completes_with_its_output(
    provider: Provider,
) -> None:
    session = await provider.create_session(CellLimits(max_wall_time_ms=WALL_MS))
    delegate = OrderedDelegate()
    delegate.hold_tools = True  # the tool never answers: only the limit ends the cell
    source = 'text("before"); store("k", 1); await tools.wait({}); text("after")'
    with trio.fail_after(30):
        response = await run(session, delegate, source, tools=[tool("wait")])
        await delegate.until(lambda: delegate.closed == ["1"])
        load = await loaded(session)
    assert response == Completed(
        cell_id="1", content_items=[InputText(text="before")], error_text=TIME_UP
    )
    assert delegate.cancelled_tools == ["tool-1"]
    assert delegate.order == ["returned tool-1", "closed 1"]  # cell_closed after the tool
    assert load == ["undefined"]  # its write was not committed


@pytest.mark.parametrize(
    "waiting",
    ["while (true) {}", "await new Promise(() => {});"],
    ids=["busy loop", "never-settling promise"],
)
async def test_a_cell_past_its_wall_time_ends_by_itself_unobserved(
    provider: Provider, waiting: str
) -> None:
    # No CPU limit: only the wall-clock limit can interrupt the busy loop.
    session = await provider.create_session(CellLimits(max_wall_time_ms=WALL_MS))
    delegate = RecordingDelegate()
    with trio.fail_after(30):
        started = await execute(session, delegate, f'text("before"); store("k", 2); {waiting}')
        started.release()  # nobody observes it: it ends all the same
        outcome = await session.wait(WaitRequest(cell_id="1", yield_time_ms=LONG_MS))
        await delegate.until(lambda: delegate.closed == ["1"])
        load = await loaded(session)
    assert outcome == LiveCell(
        response=Completed(
            cell_id="1", content_items=[InputText(text="before")], error_text=TIME_UP
        )
    )
    assert load == ["undefined"]


async def test_time_paused_at_a_pending_frontier_counts(provider: Provider) -> None:
    session = await provider.create_session(CellLimits(max_wall_time_ms=WALL_MS))
    delegate = RecordingDelegate()
    delegate.hold_tools = True
    request = ExecuteRequest(
        tool_call_id="call-1",
        source='text("before"); await tools.wait({}); text("after")',
        enabled_tools=[tool("wait")],
    )
    with trio.fail_after(30):
        frontier = await session.execute_to_pending(request, delegate)
        # Nobody resumes the paused cell: its limit ends it all the same, and its tool call
        # is cancelled before anyone observes it again.
        await delegate.until(lambda: delegate.cancelled_tools == ["tool-1"])
        outcome = await session.wait_to_pending("1")
        await delegate.until(lambda: delegate.closed == ["1"])
    assert frontier == Pending(
        cell_id="1", content_items=[InputText(text="before")], pending_tool_call_ids=["tool-1"]
    )
    assert outcome == LiveCell(
        response=Completed(cell_id="1", content_items=[], error_text=TIME_UP)
    )
    assert delegate.cancelled_tools == ["tool-1"]


async def test_a_cell_within_its_wall_time_is_untouched(provider: Provider) -> None:
    session = await provider.create_session(CellLimits(max_wall_time_ms=60_000))
    with trio.fail_after(30):
        response = await run(session, RecordingDelegate(), 'store("k", 3); text("done")')
        load = await loaded(session)
    assert response == Completed(cell_id="1", content_items=[InputText(text="done")])
    assert load == ["3"]


async def test_a_paused_wall_time_limit_goes_on_with_the_time_it_had_left(
    engine: Engine, autojump_clock: trio.testing.MockClock
) -> None:
    alarms = Alarms()
    expired: list[float] = []
    # A real engine cell, whose events no one handles here: only the limit is under test.
    with engine.start_cell("") as cell, engine.start_cell("") as other_cell:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(alarms.run)
            start = trio.current_time()
            wait = JavaScriptWait("1", cell, alarms)
            wait.limit_at(start + 1.0, lambda: expired.append(trio.current_time() - start))
            await trio.sleep(0.25)
            wait.pause_limit()
            wait.pause_limit()  # paused already: nothing more
            await trio.sleep(100)  # an approval the cell waits for: not counted
            assert expired == []
            wait.resume_limit()
            await trio.sleep(10)
            ended = JavaScriptWait("2", other_cell, alarms)
            ended.limit_at(trio.current_time() + 1.0, lambda: expired.append(-1.0))
            ended.end()  # its JavaScript ended first: the limit never comes
            await trio.sleep(10)
            nursery.cancel_scope.cancel()
    assert expired == [pytest.approx(101.0)]


async def test_a_runtime_cell_paused_deadline_does_not_end_it(
    engine: Engine, autojump_clock: trio.testing.MockClock
) -> None:
    # Trio's mock clock: the engine's threads take no time on it, the pause takes 100 s.
    delegate = RecordingDelegate()
    delegate.hold_tools = True
    async with trio.open_nursery() as nursery:
        runtime = RuntimeSession(engine, nursery, CellLimits(max_wall_time_ms=WALL_MS))
        # The runtime's session takes no idempotency keys (the client's sessions keep them).
        session = cast(codemode.Session, runtime)
        started = await execute(session, delegate, "await tools.wait({})", tools=[tool("wait")])
        cell = runtime.cell(started.cell_id)
        assert cell is not None
        cell.pause_deadline()
        begin = trio.current_time()
        await delegate.until(lambda: len(delegate.invocations) == 1)
        await trio.sleep(100)
        assert [info.phase for info in await runtime.cells()] == ["running"]
        assert await started.initial_response() == Yielded(cell_id="1", content_items=[])
        cell.resume_deadline()
        # A frontier observer has no window, which the mock clock would jump to while the
        # engine's thread handles the interrupt.
        outcome = await runtime.wait_to_pending("1")
        assert outcome == LiveCell(
            response=Completed(cell_id="1", content_items=[], error_text=TIME_UP)
        )
        assert trio.current_time() - begin >= 100 + WALL_MS / 1000
        await runtime.shutdown()


# ---- session budgets -----------------------------------------------------------------------


async def test_past_the_tool_call_budget_the_next_tool_call_rejects(provider: Provider) -> None:
    session = await provider.create_session(CellLimits(max_session_tool_calls=2))
    delegate = RecordingDelegate()
    source = """
        for (let i = 0; i < 2; i++) {
            try { await tools.echo({}); text("called"); } catch (e) { text(String(e)); }
        }
    """
    with trio.fail_after(30):
        first = await run(session, delegate, source, tools=[tool("echo")])
        second = await run(session, delegate, source, tools=[tool("echo")])
        usage = await session.usage()
    assert texts(first) == ["called", "called"]
    used_up = "session tool call budget of 2 calls is used up"
    assert texts(second) == [used_up, used_up]
    assert len(delegate.invocations) == 2  # the refused calls never reached the tool
    assert usage.tool_calls == 2


async def test_past_the_cpu_budget_the_next_execute_is_refused(provider: Provider) -> None:
    session = await provider.create_session(CellLimits(max_session_cpu_time_ms=20))
    with trio.fail_after(30):
        before = await session.usage()
        # One turn: its CPU time is counted at its end (no Idle comes before it).
        busy = await run(session, RecordingDelegate(), "for (let i = 0; i < 2e7; i++) {}")
        usage = await session.usage()
        with pytest.raises(AdmissionError) as refused:
            await execute(session, RecordingDelegate(), 'text("too late")')
    assert before == SessionUsage(tool_calls=0, cpu_time_ms=0.0)
    assert busy == Completed(cell_id="1", content_items=[])
    assert usage.cpu_time_ms >= 20
    assert str(refused.value) == "session CPU budget of 20 ms is used up"


async def test_usage_is_counted_without_a_budget(provider: Provider) -> None:
    session = await provider.create_session()
    delegate = RecordingDelegate()
    source = "await tools.echo({}); await tools.echo({}); for (let i = 0; i < 1e6; i++) {}"
    with trio.fail_after(30):
        await run(session, delegate, source, tools=[tool("echo")])
        usage = await session.usage()
    assert usage.tool_calls == 2
    assert usage.cpu_time_ms > 0


async def test_invalid_budgets_and_wall_time_are_refused_with_their_names(
    provider: Provider,
) -> None:
    for limits, text in [
        (CellLimits(max_wall_time_ms=0), "max_wall_time_ms must be positive, got 0"),
        (CellLimits(max_session_tool_calls=-1), "max_session_tool_calls must be positive"),
        (CellLimits(max_session_cpu_time_ms=0), "max_session_cpu_time_ms must be positive"),
    ]:
        with pytest.raises(InvalidRequestError, match=text):
            await provider.create_session(limits)


# ---- the wire: capabilities ----------------------------------------------------------------


def test_unset_limits_are_not_sent() -> None:
    encoded = msgspec.msgpack.encode(CellLimits(max_cpu_time_ms=5))
    assert msgspec.msgpack.decode(encoded) == {"max_cpu_time_ms": 5}


@pytest.mark.parametrize(
    ("limits", "capability"),
    [
        (CellLimits(max_wall_time_ms=WALL_MS), WALL_TIME_CAPABILITY),
        (CellLimits(max_session_tool_calls=1), BUDGET_CAPABILITY),
        (CellLimits(max_session_cpu_time_ms=1), BUDGET_CAPABILITY),
    ],
)
def test_a_host_refuses_limits_whose_capability_was_not_negotiated(
    limits: CellLimits, capability: str
) -> None:
    pair = Pair(capabilities=(LIMITS_CAPABILITY,))
    pair.handshake()
    request_id = pair.client.open_session("s", limits)
    assert not [event for event in pair.to_host() if isinstance(event, RequestReceived)]
    refusal = Err(
        kind=ErrorKind.INVALID_REQUEST,
        message=f"invalid code-mode session execution limits: {capability} was not negotiated",
    )
    assert Answered(request_id=request_id, result=refusal) in pair.to_client()


def test_a_host_refuses_usage_without_the_budget_capability() -> None:
    pair = Pair(capabilities=(LIMITS_CAPABILITY,))
    pair.handshake()
    pair.client.open_session("s", None)
    [opened] = [event for event in pair.to_host() if isinstance(event, RequestReceived)]
    pair.host.respond(opened.request_id, codemode.protocol.Ok(value=_ready("s")))
    pair.to_client()
    request_id = pair.client.usage("s")
    assert not [event for event in pair.to_host() if isinstance(event, RequestReceived)]
    refusal = Err(
        kind=ErrorKind.INVALID_REQUEST,
        message=f"code-mode session usage needs the `{BUDGET_CAPABILITY}` capability",
    )
    assert pair.to_client() == [Answered(request_id=request_id, result=refusal)]


def _ready(session_id: str) -> codemode.protocol.SessionReady:
    return codemode.protocol.SessionReady(session_id=session_id)


@pytest.mark.slow
async def test_the_client_sends_no_new_limit_to_a_host_without_its_capability() -> None:
    limited = [sys.executable, str(Path(__file__).with_name("limited_host.py"))]
    command = [*limited, LIMITS_CAPABILITY]
    with trio.fail_after(30):
        async with codemode.open_process_provider(host_command=command) as provider:
            for limits, text in [
                (
                    CellLimits(max_wall_time_ms=WALL_MS),
                    "code-mode host does not support cell wall time limits: missing"
                    f" `{WALL_TIME_CAPABILITY}` capability",
                ),
                (
                    CellLimits(max_session_tool_calls=1),
                    "code-mode host does not support session budgets: missing"
                    f" `{BUDGET_CAPABILITY}` capability",
                ),
            ]:
                with pytest.raises(InvalidRequestError) as refused:
                    await provider.create_session(limits)  # opened on the host at once
                assert str(refused.value) == text
            session = await provider.create_session(CellLimits(max_cpu_time_ms=1000))
            assert texts(await run(session, RecordingDelegate(), 'text("served")')) == ["served"]
            with pytest.raises(
                codemode.CodeModeError,
                match=f"code-mode host does not support session usage: missing `{BUDGET_CAPABILITY}`",
            ):
                await session.usage()
