"""Cell behaviour through the public API: design.md, runtime 9.4 (cell actor) and 9.6
(continuing cell), plus what this project adds (busy cells, limits, shutdown bounds)."""

from __future__ import annotations

import gc

import pytest
import trio
from codemode_host.runtime import observation_window_ms

from codemode import (
    CellLimits,
    Completed,
    ImageDetail,
    InputImage,
    InputText,
    JsonValue,
    LiveCell,
    MissingCell,
    NestedToolCall,
    Session,
    StartedCell,
    Terminated,
    ToolError,
    WaitRequest,
    Yielded,
)
from codemode.errors import AlreadyTerminatingError, CodeModeError, ObserverBusyError
from tests.conftest import Provider
from tests.delegates import RecordingDelegate
from tests.sessions import LONG_MS, all_tasks_blocked, execute, run, texts, tool


def wait_request(cell_id: str = "1", yield_time_ms: int = LONG_MS) -> WaitRequest:
    return WaitRequest(cell_id=cell_id, yield_time_ms=yield_time_ms)


# ---- 9.4 ---------------------------------------------------------------------------------


async def test_yield_timer_preempts_buffered_runtime_output(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(10):
        first = await run(
            session, delegate, 'text("queued output"); while (true) {}', yield_time_ms=0
        )
        outcome = await session.terminate("1")
    assert first == Yielded(cell_id="1", content_items=[])
    assert outcome == LiveCell(
        response=Terminated(cell_id="1", content_items=[InputText(text="queued output")])
    )


async def test_the_observation_that_takes_a_completion_has_closed_the_cell(
    session: Session, delegate: RecordingDelegate
) -> None:
    # Reference-runtime 5.4, step 6: once its completion is delivered, the cell is gone and its
    # `cell_closed` has run, before the observer's caller goes on (an initial response, then a
    # wait after a yield).
    with trio.fail_after(10):
        first = await run(session, delegate, 'text("one")')
        closed_after_first = list(delegate.closed)
        yielded = await run(session, delegate, 'yield_control(); await null; text("two")')
        outcome = await session.wait(wait_request(cell_id="2"))
        closed_after_wait = list(delegate.closed)
        later = await session.wait(wait_request(cell_id="2"))
    assert first == Completed(cell_id="1", content_items=[InputText(text="one")])
    assert closed_after_first == ["1"]
    assert yielded == Yielded(cell_id="2", content_items=[])
    assert outcome == LiveCell(
        response=Completed(cell_id="2", content_items=[InputText(text="two")])
    )
    assert closed_after_wait == ["1", "2"]
    assert isinstance(later, MissingCell)


# In-process only (documented in docs/python-api.md, "In-process and process providers"): with
# a host, the initial observation starts on the host at once, so the completion of a short cell
# usually wins the race against a terminate sent right after execute.
@pytest.mark.parametrize("provider", ["in-process"], indirect=True)
async def test_queued_termination_preempts_unobserved_runtime_completion(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(10):
        started = await execute(session, delegate, 'text("x")')
        outcome = await session.terminate("1")
        initial = await started.initial_response()
    # Whether the JS ran before the interrupt is a race; the termination wins either way.
    assert isinstance(outcome, LiveCell)
    assert isinstance(outcome.response, Terminated)
    assert initial == outcome.response


async def test_observation_dropped_before_dequeue_does_not_consume_output(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(10):
        started = await execute(
            session, delegate, 'text("kept"); notify("ready"); await new Promise(() => {})'
        )
        with trio.CancelScope() as scope:
            scope.cancel()
            await started.initial_response()
        # The notification follows the text: once the delegate has it, the output is buffered.
        await delegate.until(lambda: len(delegate.notifications) == 1)
        outcome = await session.wait(wait_request(yield_time_ms=1))
    assert outcome == LiveCell(
        response=Yielded(cell_id="1", content_items=[InputText(text="kept")])
    )


async def test_dropped_yield_observer_preserves_output_for_the_next_observation(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(10):
        started = await execute(
            session, delegate, 'text("first"); notify("ready"); await new Promise(() => {})'
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(started.initial_response)
            await all_tasks_blocked()
            with pytest.raises(ObserverBusyError):
                await session.wait(wait_request())
            nursery.cancel_scope.cancel()
        # The notification follows the text: once the delegate has it, the output is buffered.
        await delegate.until(lambda: len(delegate.notifications) == 1)
        outcome = await session.wait(wait_request(yield_time_ms=1))
    assert texts(outcome) == ["first"]


async def test_only_the_first_termination_claims_a_buffered_completion(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(10):
        first = await run(session, delegate, 'yield_control(); store("k", 1); text("done")')
        assert first == Yielded(cell_id="1", content_items=[])
        # Poll with probe cells until the completion is buffered (its writes are committed).
        while texts(await run(session, delegate, 'text(load("k"))')) != ["1"]:
            pass
        outcomes: list[object] = []

        async def terminate() -> None:
            try:
                outcomes.append(await session.terminate("1"))
            except AlreadyTerminatingError as error:
                outcomes.append(str(error))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(terminate)
            nursery.start_soon(terminate)
    completed = LiveCell(response=Completed(cell_id="1", content_items=[InputText(text="done")]))
    assert sorted(outcomes, key=str) == sorted(
        [completed, "exec cell 1 is already terminating"], key=str
    )


async def test_termination_claim_prevents_stored_value_commit(
    session: Session, delegate: RecordingDelegate
) -> None:
    delegate.hold_tools = True
    with trio.fail_after(10):
        await execute(
            session,
            delegate,
            'store("k", 1); await tools.wait({})',
            tools=[tool("wait")],
            observe_initial=False,
        )
        await delegate.until(lambda: len(delegate.invocations) == 1)
        await session.terminate("1")
        response = await run(session, delegate, 'text(load("k"))')
    assert texts(response) == ["undefined"]


async def test_failed_completion_delivery_rebuffers_the_event(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(10):
        started = await execute(session, delegate, 'yield_control(); text("done")')
        assert await started.initial_response() == Yielded(cell_id="1", content_items=[])
        # An observer cancelled before it could take the completion leaves it buffered.
        with trio.CancelScope() as scope:
            scope.cancel()
            await session.wait(wait_request())
        outcome = await session.wait(wait_request())
    assert outcome == LiveCell(
        response=Completed(cell_id="1", content_items=[InputText(text="done")])
    )


async def test_buffered_initial_yield_precedes_buffered_completion_for_yield_observer(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(10):
        started = await execute(session, delegate, 'text("a"); yield_control(); text("b")')
        # The JS finishes before anyone awaits the initial response.
        first = await started.initial_response()
        second = await session.wait(wait_request())
    assert first == Yielded(cell_id="1", content_items=[InputText(text="a")])
    assert second == LiveCell(response=Completed(cell_id="1", content_items=[InputText(text="b")]))


async def test_yield_control_with_no_observer_attached_is_ignored(
    session: Session, delegate: RecordingDelegate
) -> None:
    # Reference-runtime 3.9: the output keeps accumulating, and the next observation ends at
    # its own window or the cell's end, not at the yield that nobody observed.
    delegate.hold_tools = True
    source = """
        text("a"); yield_control(); await tools.gate({});
        text("b"); yield_control(); notify("past"); text("c");
    """
    with trio.fail_after(10):
        first = await run(session, delegate, source, tools=[tool("gate")])
        delegate.release.set()
        # The notification follows the second yield: the host has handled that yield, with
        # no observer attached, before the delegate hears of it.
        await delegate.until(lambda: len(delegate.notifications) == 1)
        rest = await session.wait(wait_request())
    assert first == Yielded(cell_id="1", content_items=[InputText(text="a")])
    assert rest == LiveCell(
        response=Completed(cell_id="1", content_items=[InputText(text="b"), InputText(text="c")])
    )


# ---- 9.6 ---------------------------------------------------------------------------------


async def test_synchronous_execution_emits_granular_events_in_order(
    session: Session, delegate: RecordingDelegate
) -> None:
    source = """
        text("one");
        image("data:image/png;base64,AAA");
        notify("note");
        yield_control();
        yield_control();
        text("two");
        store("answer", 42);
    """
    with trio.fail_after(10):
        first = await run(session, delegate, source)
        rest = await session.wait(wait_request())
        if rest == LiveCell(response=Yielded(cell_id="1", content_items=[])):
            # The worker was preempted between the two yields, long enough for this wait to
            # attach before the second reached the host: it yields the wait, with nothing new.
            rest = await session.wait(wait_request())
        later = await run(session, delegate, 'text(load("answer"))')
    assert first == Yielded(
        cell_id="1",
        content_items=[
            InputText(text="one"),
            InputImage(image_url="data:image/png;base64,AAA", detail=ImageDetail.HIGH),
        ],
    )
    assert rest == LiveCell(response=Completed(cell_id="1", content_items=[InputText(text="two")]))
    assert delegate.notifications == [("call-1", "1", "note")]
    assert texts(later) == ["42"]


async def test_termination_queued_before_start_emits_a_direct_terminal(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(10):
        await execute(
            session, delegate, 'text("never seen?"); while (true) {}', observe_initial=False
        )
        outcome = await session.terminate("1")
    assert isinstance(outcome, LiveCell)
    assert isinstance(outcome.response, Terminated)


async def test_late_tool_result_after_completion_does_not_lose_it(
    session: Session, delegate: RecordingDelegate
) -> None:
    delegate.hold_tools = True
    with trio.fail_after(10):
        response = await run(session, delegate, 'tools.t({}); text("done")', tools=[tool("t")])
        delegate.release.set()
    assert response == Completed(cell_id="1", content_items=[InputText(text="done")])


async def test_concurrent_callbacks_accept_results_and_errors_in_any_order(
    session: Session,
) -> None:
    second_may_finish = trio.Event()

    async def behaviour(call: NestedToolCall) -> JsonValue:
        if call.runtime_tool_call_id == "tool-1":
            await second_may_finish.wait()
            raise ToolError("first failed")
        second_may_finish.set()
        return "second"

    delegate = RecordingDelegate(on_tool=behaviour)
    source = """
        const first = tools.t({}).catch((error) => error);
        const second = tools.t({});
        const results = await Promise.all([first, second]);
        for (const r of results) text(r);
        text(typeof results[0]);
    """
    with trio.fail_after(10):
        response = await run(session, delegate, source, tools=[tool("t")])
    assert texts(response) == ["first failed", "second", "string"]


async def test_termination_wins_after_yield_and_cleans_up_a_pending_timer(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(10):
        first = await run(
            session,
            delegate,
            'text("a"); yield_control(); await new Promise((r) => setTimeout(r, 60000)); text("b")',
        )
        outcome = await session.terminate("1")
    assert first == Yielded(cell_id="1", content_items=[InputText(text="a")])
    assert outcome == LiveCell(response=Terminated(cell_id="1", content_items=[]))


async def test_script_failure_preserves_writes_and_does_not_poison_the_next_isolate(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(10):
        failed = await run(session, delegate, 'store("kept", 1); throw new Error("boom")')
        healthy = await run(session, delegate, 'text(load("kept")); text(typeof boom)')
    assert isinstance(failed, Completed)
    assert failed.error_text is not None
    assert "boom" in failed.error_text
    assert texts(healthy) == ["1", "undefined"]


# ---- what codemode adds ------------------------------------------------------------------


async def test_a_cell_that_prints_then_spins_shows_its_output_to_the_next_wait(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(10):
        first = await run(
            session, delegate, 'text("progress"); notify("ready"); while (true) {}', yield_time_ms=0
        )
        assert first == Yielded(cell_id="1", content_items=[])
        # The notification follows the text: once the delegate has it, the output is buffered.
        await delegate.until(lambda: len(delegate.notifications) == 1)
        outcome = await session.wait(wait_request(yield_time_ms=1))
        await session.terminate("1")
    assert outcome == LiveCell(
        response=Yielded(cell_id="1", content_items=[InputText(text="progress")])
    )


async def test_yield_control_in_a_busy_cell_yields_at_once(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(10):
        first = await run(session, delegate, 'text("now"); yield_control(); while (true) {}')
        await session.terminate("1")
    assert first == Yielded(cell_id="1", content_items=[InputText(text="now")])


async def test_shutdown_with_three_spinning_cells_returns_within_a_second(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(10):
        for _ in range(3):
            await run(session, delegate, "for (;;) {}", yield_time_ms=0)
    with trio.fail_after(1):
        await session.shutdown()
    assert sorted(delegate.closed) == ["1", "2", "3"]


async def test_heap_limited_session_survives_unbounded_allocation(provider: Provider) -> None:
    session = await provider.create_session(limits=CellLimits(max_heap_size_bytes=16 << 20))
    delegate = RecordingDelegate()
    with trio.fail_after(10):
        hog = await run(
            session, delegate, "const a = []; for (;;) a.push(new Array(1000).fill(7));"
        )
        after = await run(session, delegate, 'text("alive")')
    assert isinstance(hog, Completed)
    assert hog.error_text is not None
    assert "out of memory" in hog.error_text
    assert after == Completed(cell_id="2", content_items=[InputText(text="alive")])


async def test_max_yield_time_clamps_execute_and_wait(provider: Provider) -> None:
    session = await provider.create_session(limits=CellLimits(max_yield_time_ms=20))
    delegate = RecordingDelegate()
    with trio.fail_after(10):
        first = await run(session, delegate, "await new Promise(() => {})", yield_time_ms=LONG_MS)
        second = await session.wait(wait_request(yield_time_ms=LONG_MS))
        await session.terminate("1")
    assert first == Yielded(cell_id="1", content_items=[])
    assert second == LiveCell(response=Yielded(cell_id="1", content_items=[]))


def test_observation_window_grace_and_clamp() -> None:
    assert observation_window_ms(9_999, CellLimits()) == 9_999
    assert observation_window_ms(10_000, CellLimits()) == 11_000
    assert observation_window_ms(0, CellLimits()) == 0
    assert observation_window_ms(10_000, CellLimits(max_yield_time_ms=10_500)) == 10_500
    assert observation_window_ms(500, CellLimits(max_yield_time_ms=100)) == 100


@pytest.mark.slow
async def test_a_shielding_delegate_cannot_hold_termination_past_the_grace(
    session: Session, delegate: RecordingDelegate
) -> None:
    delegate.hold_tools = True
    delegate.slow_cleanup = trio.Event()  # never set: the tool would shield forever
    with trio.fail_after(10):
        await execute(
            session, delegate, "await tools.t({})", tools=[tool("t")], observe_initial=False
        )
        await delegate.until(lambda: len(delegate.invocations) == 1)
        with trio.fail_after(3):
            outcome = await session.terminate("1")
            await delegate.until(lambda: delegate.closed == ["1"])
        assert outcome == LiveCell(response=Terminated(cell_id="1", content_items=[]))
        delegate.slow_cleanup.set()


async def test_wait_on_a_closed_cell_is_missing(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(10):
        await run(session, delegate, 'text("x")')
        outcome = await session.wait(wait_request())
    assert outcome == MissingCell(
        response=Completed(cell_id="1", content_items=[], error_text="exec cell 1 not found")
    )


async def test_dropping_the_started_cell_frees_the_observer_slot(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(10):
        started = await execute(
            session, delegate, 'text("kept"); notify("ready"); await new Promise(() => {})'
        )
        with pytest.warns(ResourceWarning, match=r"exec cell '1' of session 'session-1'"):
            del started
        # The notification follows the text: once the delegate has it, the output is buffered.
        await delegate.until(lambda: len(delegate.notifications) == 1)
        # Its `__del__` schedules the release with run_sync_soon: let it run.
        await all_tasks_blocked()
        outcome = await session.wait(wait_request(yield_time_ms=1))
        await session.terminate("1")
    assert texts(outcome) == ["kept"]


async def test_a_wait_right_after_dropping_the_started_cell_observes_it(
    session: Session, delegate: RecordingDelegate
) -> None:
    # Its `__del__` only schedules the release; a wait attaches before its first checkpoint,
    # so it runs the dropped cells' releases first (it met ObserverBusyError before).
    with trio.fail_after(10):
        started = await execute(
            session, delegate, 'text("kept"); notify("ready"); await new Promise(() => {})'
        )
        await delegate.until(lambda: len(delegate.notifications) == 1)
        with pytest.warns(ResourceWarning):
            del started  # no checkpoint from here to the wait's attach
        outcome = await session.wait(wait_request(yield_time_ms=1))
        await session.terminate("1")
    assert texts(outcome) == ["kept"]


def test_a_started_cell_has_no_public_constructor() -> None:
    # Also not on its way out: the half-made object's `__del__` must not raise (pytest turns
    # an unraisable exception into an error).
    with pytest.raises(TypeError, match="no public constructor"):
        StartedCell()
    gc.collect()


async def test_tool_exceptions_reject_the_promise(session: Session) -> None:
    async def behaviour(call: NestedToolCall) -> JsonValue:
        if call.input == {"kind": "tool-error"}:
            raise ToolError("plain text")
        if call.input == {"kind": "crash"}:
            raise RuntimeError("boom")
        return object()  # not JSON

    delegate = RecordingDelegate(on_tool=behaviour)
    source = """
        for (const kind of ["tool-error", "crash", "not-json"]) {
          try { await tools.t({ kind }); } catch (e) { text(e); }
        }
    """
    with trio.fail_after(10):
        response = await run(session, delegate, source, tools=[tool("t")])
    assert texts(response) == [
        "plain text",
        "tool t failed: boom",
        "tool t failed: Encoding objects of type object is unsupported",
    ]


@pytest.mark.parametrize(
    ("limits", "problem"),
    [
        (CellLimits(max_yield_time_ms=-1), "max_yield_time_ms must not be negative, got -1"),
        (CellLimits(max_heap_size_bytes=0), "max_heap_size_bytes must be positive, got 0"),
    ],
)
async def test_invalid_limits_are_refused(
    provider: Provider, limits: CellLimits, problem: str
) -> None:
    with pytest.raises(
        CodeModeError, match=f"^invalid code-mode session execution limits: {problem}$"
    ):
        await provider.create_session(limits=limits)


async def test_timers_due_together_fire_in_the_order_they_were_set(
    session: Session, delegate: RecordingDelegate
) -> None:
    # HTML's timer rule: timers of equal delay run in the order they were set.
    source = """
        const order = [];
        await new Promise((resolve) => {
            for (let i = 0; i < 20; i++) {
                setTimeout(() => { order.push(i); if (order.length === 20) resolve(); }, 5);
            }
        });
        text(order.join(","));
    """
    with trio.fail_after(10):
        response = await run(session, delegate, source)
    assert texts(response) == [",".join(str(i) for i in range(20))]
