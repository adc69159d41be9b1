"""The pending frontier, preempt and sessions without stored values, on both providers.

Ports of design.md, runtime 9.1 to 9.5 (`execute_to_pending_*`, `wait_to_pending_*`, the
frontier tests of the contract and cell-actor suites), plus preempt (the reference
host's `operation/yield`), the cancellation rule for `execute_to_pending`, `store_load=False` and
the capabilities a host must offer for them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trio
from codemode_host.engine import Engine
from codemode_host.runtime import RuntimeSession

import codemode
from codemode import (
    CellLimits,
    CodeModeError,
    Completed,
    ExecuteRequest,
    InputText,
    LiveCell,
    MissingCell,
    Pending,
    Session,
    Terminated,
    WaitRequest,
    Yielded,
)
from codemode.errors import ObserverBusyError
from tests.conftest import Provider
from tests.delegates import RecordingDelegate
from tests.sessions import LONG_MS, all_tasks_blocked, execute, texts, tool

ECHO = [tool("echo")]


def request(source: str, *, yield_time_ms: int = LONG_MS) -> ExecuteRequest:
    return ExecuteRequest(
        tool_call_id="call-1", source=source, enabled_tools=ECHO, yield_time_ms=yield_time_ms
    )


def pending(items: list[str], ids: list[str], cell_id: str = "1") -> Pending:
    return Pending(
        cell_id=cell_id,
        content_items=[InputText(text=text) for text in items],
        pending_tool_call_ids=ids,
    )


def holding() -> RecordingDelegate:
    """A delegate whose tool calls wait until `release` is set."""
    delegate = RecordingDelegate()
    delegate.hold_tools = True
    return delegate


TERMINATED = LiveCell(response=Terminated(cell_id="1", content_items=[]))


# ---- design.md, runtime 9.1: execute_to_pending / wait_to_pending --------------------------


async def test_execute_to_pending_returns_completed_for_synchronous_results(
    session: Session,
) -> None:
    with trio.fail_after(10):
        response = await session.execute_to_pending(request('text("done");'), RecordingDelegate())
    assert response == Completed(cell_id="1", content_items=[InputText(text="done")])


async def test_execute_to_pending_returns_once_the_runtime_is_quiescent(session: Session) -> None:
    source = 'text("before"); await new Promise(() => {});'
    with trio.fail_after(10):
        response = await session.execute_to_pending(request(source), RecordingDelegate())
        assert response == pending(["before"], [])
        assert await session.terminate("1") == TERMINATED


async def test_execute_to_pending_identifies_tool_calls_in_paused_frontier(
    session: Session,
) -> None:
    source = 'await Promise.all([tools.echo({ value: "first" }), tools.echo({ value: "second" })]);'
    with trio.fail_after(10):
        response = await session.execute_to_pending(request(source), holding())
        assert response == pending([], ["tool-1", "tool-2"])
        assert await session.terminate("1") == TERMINATED


async def test_execute_to_pending_excludes_delayed_timeout_tool_calls_until_wait(
    session: Session,
) -> None:
    # The reference sleeps past a 1 s timer; here the resumed observation waits for the timer
    # whether it fired during the pause (held, then run on resume) or fires after.
    source = """
        setTimeout(() => { tools.echo({ value: "delayed" }); }, 200);
        await Promise.all([tools.echo({ value: "second" }), tools.echo({ value: "third" })]);
    """
    with trio.fail_after(10):
        first = await session.execute_to_pending(request(source), holding())
        assert first == pending([], ["tool-1", "tool-2"])
        resumed = await session.wait_to_pending("1")
        assert resumed == LiveCell(response=pending([], ["tool-3"]))
        assert await session.terminate("1") == TERMINATED


async def test_wait_to_pending_returns_after_resumed_runtime_becomes_quiescent_again(
    session: Session,
) -> None:
    delegate = holding()
    source = 'await tools.echo({}); text("after"); await new Promise(() => {});'
    with trio.fail_after(10):
        assert await session.execute_to_pending(request(source), delegate) == pending(
            [], ["tool-1"]
        )
        delegate.release.set()
        resumed = await session.wait_to_pending("1")
        assert resumed == LiveCell(response=pending(["after"], []))
        assert await session.terminate("1") == TERMINATED


async def test_wait_to_pending_returns_completed_after_resumed_runtime_finishes(
    session: Session,
) -> None:
    delegate = holding()
    with trio.fail_after(10):
        first = await session.execute_to_pending(
            request('await tools.echo({}); text("done");'), delegate
        )
        assert first == pending([], ["tool-1"])
        delegate.release.set()
        resumed = await session.wait_to_pending("1")
    assert resumed == LiveCell(
        response=Completed(cell_id="1", content_items=[InputText(text="done")])
    )


async def test_wait_to_pending_of_a_missing_cell(session: Session) -> None:
    with trio.fail_after(10):
        outcome = await session.wait_to_pending("missing")
    assert isinstance(outcome, MissingCell)
    assert isinstance(outcome.response, Completed)
    assert outcome.response.error_text == "exec cell missing not found"


# ---- design.md, runtime 9.2 and 9.4: the contract and the cell actor ----------------------


async def test_returns_and_resumes_from_the_pending_frontier(session: Session) -> None:
    delegate = holding()
    with trio.fail_after(10):
        first = await session.execute_to_pending(
            request('await tools.echo({}); text("after");'), delegate
        )
        assert first == pending([], ["tool-1"])
        # The delegate saw the call while the cell sits at its frontier.
        assert [call.runtime_tool_call_id for call in delegate.invocations] == ["tool-1"]
        delegate.release.set()
        resumed = await session.wait_to_pending("1")
        await delegate.until(lambda: delegate.closed == ["1"])
    assert resumed == LiveCell(
        response=Completed(cell_id="1", content_items=[InputText(text="after")])
    )


async def test_dropped_pending_observer_preserves_the_frontier_for_the_next_observation(
    session: Session,
) -> None:
    gate = trio.Event()
    answers = {"gate": gate}

    async def behaviour(call: codemode.NestedToolCall) -> codemode.JsonValue:
        assert isinstance(call.input, dict)
        await answers[str(call.input["name"])].wait()
        return "answered"

    delegate = RecordingDelegate(on_tool=behaviour)
    answers["second"] = trio.Event()
    source = """
        await tools.echo({ name: "gate" });
        text(await tools.echo({ name: "second" }));
        await new Promise(() => {});
    """
    with trio.fail_after(10):
        assert await session.execute_to_pending(request(source), delegate) == pending(
            [], ["tool-1"]
        )
        with trio.CancelScope() as dropped:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(session.wait_to_pending, "1")
                await all_tasks_blocked()
                dropped.cancel()
        # The dropped observer resumed the cell: the gate's answer reaches it, the cell calls
        # `second`, and pauses at a frontier nobody observes.
        gate.set()
        await delegate.until(lambda: len(delegate.invocations) == 2)
        kept = await session.wait_to_pending("1")
        assert kept == LiveCell(response=pending([], ["tool-2"]))
        answers["second"].set()
        resumed = await session.wait_to_pending("1")
        assert resumed == LiveCell(response=pending(["answered"], []))
        assert await session.terminate("1") == TERMINATED


async def test_pending_observer_merges_initial_yield_and_completion_output(
    session: Session,
) -> None:
    delegate = holding()
    source = """
        text("before"); yield_control(); await tools.echo({}); text("after"); notify("done");
    """
    with trio.fail_after(10):
        started = await execute(session, delegate, source, tools=ECHO)
        started.release()
        await delegate.until(lambda: len(delegate.invocations) == 1)
        delegate.release.set()
        # Once the delegate has the notification, the cell has run its last turn: the frontier
        # observer finds the completion (the yield boundary left no mark on it).
        await delegate.until(lambda: len(delegate.notifications) == 1)
        outcome = await session.wait_to_pending("1")
    assert outcome == LiveCell(
        response=Completed(
            cell_id="1", content_items=[InputText(text="before"), InputText(text="after")]
        )
    )


async def test_pending_frontier_rejects_a_second_observer_and_termination_preempts_the_first(
    session: Session,
) -> None:
    delegate = holding()
    outcomes: list[codemode.WaitOutcome] = []

    async def observe() -> None:
        outcomes.append(await session.wait_to_pending("1"))

    with trio.fail_after(10):
        await session.execute_to_pending(request('await tools.echo({}); text("x")'), delegate)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(observe)
            await all_tasks_blocked()
            with pytest.raises(ObserverBusyError, match="exec cell 1 already has an active"):
                await session.wait_to_pending("1")
            with pytest.raises(ObserverBusyError):
                await session.wait(WaitRequest(cell_id="1", yield_time_ms=1))
            assert await session.terminate("1") == TERMINATED
    assert outcomes == [TERMINATED]


async def test_a_plain_wait_resumes_a_paused_cell(session: Session) -> None:
    delegate = holding()
    source = 'await tools.echo({}); text("after"); yield_control(); await new Promise(() => {})'
    with trio.fail_after(10):
        assert await session.execute_to_pending(request(source), delegate) == pending(
            [], ["tool-1"]
        )
        delegate.release.set()
        outcome = await session.wait(WaitRequest(cell_id="1", yield_time_ms=LONG_MS))
        assert outcome == LiveCell(
            response=Yielded(cell_id="1", content_items=[InputText(text="after")])
        )
        assert await session.terminate("1") == TERMINATED


async def test_frontier_observers_ignore_yield_control_and_their_window(session: Session) -> None:
    source = 'text("a"); yield_control(); text("b"); await new Promise(() => {});'
    with trio.fail_after(10):
        response = await session.execute_to_pending(
            request(source, yield_time_ms=0), RecordingDelegate()
        )
        assert response == pending(["a", "b"], [])
        assert await session.terminate("1") == TERMINATED


# ---- cancellation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source", ["tools.echo({}); while (true) {}", "while (true) {}"], ids=["calling", "spinning"]
)
async def test_cancelled_execute_to_pending_terminates_the_cell(
    session: Session, source: str
) -> None:
    delegate = holding()
    with trio.fail_after(10):
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(session.execute_to_pending, request(source), delegate)
                if "tools" in source:
                    await delegate.until(lambda: len(delegate.invocations) == 1)
                else:
                    await all_tasks_blocked()
                scope.cancel()
        await delegate.until(lambda: delegate.closed == ["1"])
        assert isinstance(await session.wait(WaitRequest(cell_id="1")), MissingCell)
    if "tools" in source:
        assert delegate.cancelled_tools == ["tool-1"]


# ---- preempt -----------------------------------------------------------------------------


async def test_preempt_yields_a_busy_loop_now(session: Session) -> None:
    delegate = RecordingDelegate()
    source = 'text("a"); notify("ready"); while (true) {}'
    with trio.fail_after(10):
        started = await execute(session, delegate, source)
        async with trio.open_nursery() as nursery:
            responses: list[codemode.RuntimeResponse] = []

            async def observe() -> None:
                responses.append(await started.initial_response())

            nursery.start_soon(observe)
            await delegate.until(lambda: len(delegate.notifications) == 1)
            await all_tasks_blocked()
            await session.preempt("1")
        assert responses == [Yielded(cell_id="1", content_items=[InputText(text="a")])]
        assert await session.terminate("1") == TERMINATED


async def test_preempt_yields_a_wait_on_a_tool(session: Session) -> None:
    delegate = holding()
    source = 'text("a"); yield_control(); text("b"); await tools.echo({}); text("c");'
    with trio.fail_after(10):
        started = await execute(session, delegate, source, tools=ECHO)
        assert texts(await started.initial_response()) == ["a"]
        async with trio.open_nursery() as nursery:
            outcomes: list[codemode.WaitOutcome] = []

            async def observe() -> None:
                outcomes.append(await session.wait(WaitRequest(cell_id="1")))

            nursery.start_soon(observe)
            await delegate.until(lambda: len(delegate.invocations) == 1)
            await all_tasks_blocked()
            await session.preempt("1")
        assert outcomes == [
            LiveCell(response=Yielded(cell_id="1", content_items=[InputText(text="b")]))
        ]
        delegate.release.set()
        final = await session.wait(WaitRequest(cell_id="1"))
    assert final == LiveCell(response=Completed(cell_id="1", content_items=[InputText(text="c")]))


async def test_preempt_without_an_observer_does_nothing(session: Session) -> None:
    delegate = holding()
    source = 'text("a"); await tools.echo({}); text("b");'
    with trio.fail_after(10):
        await session.preempt("unknown")
        started = await execute(session, delegate, source, tools=ECHO)
        started.release()
        await delegate.until(lambda: len(delegate.invocations) == 1)
        await session.preempt("1")
        delegate.release.set()
        outcome = await session.wait(WaitRequest(cell_id="1"))
    assert isinstance(outcome, LiveCell)
    assert isinstance(outcome.response, Completed)
    assert texts(outcome) == ["a", "b"]


async def test_preempt_has_no_effect_on_a_frontier_observer(session: Session) -> None:
    delegate = holding()
    outcomes: list[codemode.WaitOutcome] = []
    with trio.fail_after(10):
        await session.execute_to_pending(request('await tools.echo({}); text("done")'), delegate)

        async def observe() -> None:
            outcomes.append(await session.wait_to_pending("1"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(observe)
            await all_tasks_blocked()
            await session.preempt("1")
            await all_tasks_blocked()
            assert outcomes == []
            delegate.release.set()
    assert outcomes == [
        LiveCell(response=Completed(cell_id="1", content_items=[InputText(text="done")]))
    ]


# ---- sessions without stored values --------------------------------------------------------


async def test_sessions_without_stored_values_have_no_store_or_load(provider: Provider) -> None:
    probe = 'text(typeof store + " " + typeof load + " " + ("store" in globalThis));'
    with trio.fail_after(10):
        bare = await provider.create_session(store_load=False)
        storing = await provider.create_session()
        bare_text = await bare.execute_to_pending(request(probe), RecordingDelegate())
        stored = await storing.execute_to_pending(
            request('store("k", 1); text(typeof load)'), RecordingDelegate()
        )
        loaded = await storing.execute_to_pending(
            request('text(String(load("k")))'), RecordingDelegate()
        )
        failing = await bare.execute_to_pending(request('store("k", 1)'), RecordingDelegate())
    assert texts(bare_text) == ["undefined undefined false"]
    assert texts(stored) == ["function"]
    assert texts(loaded) == ["1"]
    assert isinstance(failing, Completed)
    assert failing.error_text is not None
    assert failing.error_text.startswith("ReferenceError: store is not defined")


# ---- the runtime: commands are frozen while paused (design.md, runtime 9.5) -----------------


async def test_pending_mode_freezes_runtime_commands_until_resume(engine: Engine) -> None:
    # The reference freezes a timer's firing; a tool answer released after the frontier is
    # the same kind of command, and its timing is the test's to choose.
    delegate = holding()
    source = 'text("start"); await tools.echo({}); text("after"); await new Promise(() => {});'
    async with trio.open_nursery() as nursery:
        runtime = RuntimeSession(engine, nursery, CellLimits())
        with trio.fail_after(10):
            first = await runtime.execute_to_pending(request(source), delegate)
            assert first == pending(["start"], ["tool-1"])
            cell = runtime.cell("1")
            assert cell is not None
            delegate.release.set()
            await all_tasks_blocked()  # the answer is in, and held
            assert cell._frontier.held == 1
            resumed = await runtime.wait_to_pending("1")
            assert resumed == LiveCell(response=pending(["after"], []))
            assert cell._frontier.held == 0
            await runtime.shutdown()


# ---- a host without the capabilities ---------------------------------------------------------


@pytest.mark.slow
async def test_a_host_without_the_capabilities_is_refused_with_their_names() -> None:
    command = [sys.executable, str(Path(__file__).with_name("limited_host.py"))]
    with trio.fail_after(20):
        async with codemode.open_process_provider(host_command=command) as provider:
            session = await provider.create_session()
            with pytest.raises(CodeModeError, match="missing `pending-frontier` capability"):
                await session.execute_to_pending(request("text(1)"), RecordingDelegate())
            with pytest.raises(CodeModeError, match="missing `pending-frontier` capability"):
                await session.wait_to_pending("1")
            with pytest.raises(CodeModeError, match="missing `yield-observation` capability"):
                await session.preempt("1")
            started = await execute(session, RecordingDelegate(), 'text("still served")')
            assert texts(await started.initial_response()) == ["still served"]
