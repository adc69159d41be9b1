"""Every limit of a cell contained to that cell, with its exact text (docs/limits.md).

Each test checks the limit's text and that the session (and the host) serves the next cell.
Both providers run each session-level test; the engine-wide heap budget is tested on an engine.
"""

from __future__ import annotations

import re

import pytest
import trio
import trio.testing
from codemode_host.engine import Engine, open_engine

import codemode
from codemode import (
    DEFAULT_HEAP_SIZE_BYTES,
    CellLimits,
    Completed,
    InputText,
    InvalidRequestError,
    LiveCell,
    Session,
    Terminated,
    WaitRequest,
    Yielded,
)
from tests.conftest import Provider
from tests.delegates import RecordingDelegate
from tests.helpers import run_cell
from tests.sessions import LONG_MS, execute, run, texts, tool

ALLOCATE_FOREVER = "const a = []; while (true) a.push(new Array(100000).fill(1));"


async def still_serves(session: Session) -> None:
    response = await run(session, RecordingDelegate(), 'text("next")')
    assert texts(response) == ["next"]


def failure(response: object) -> str:
    assert isinstance(response, Completed), response
    assert response.error_text is not None
    return response.error_text


# ---- heap ----------------------------------------------------------------------------------


@pytest.mark.slow
async def test_the_default_heap_limit_fails_an_unbounded_allocation(session: Session) -> None:
    with trio.fail_after(60):
        response = await run(session, RecordingDelegate(), ALLOCATE_FOREVER)
        await still_serves(session)
    assert failure(response).startswith(
        "InternalError: out of memory: exec cell exceeded its heap limit of"
        f" {DEFAULT_HEAP_SIZE_BYTES} bytes"
    )


async def test_string_and_array_doubling_hit_the_heap_limit(provider: Provider) -> None:
    session = await provider.create_session(CellLimits(max_heap_size_bytes=32 << 20))
    doubling = {
        "string": 'let s = "x"; while (true) s = s + s;',
        "array": "let a = [1]; while (true) a = a.concat(a);",
    }
    with trio.fail_after(60):
        for source in doubling.values():
            response = await run(session, RecordingDelegate(), source)
            # QuickJS may refuse the length before the heap: either ends the cell cleanly.
            assert failure(response).startswith(
                ("InternalError: out of memory", "InternalError: string too long")
            )
        await still_serves(session)


async def test_the_engine_heap_budget_fails_the_cell_that_would_pass_it() -> None:
    async with open_engine(heap_budget=48 << 20) as engine:
        with trio.fail_after(60):
            run = await run_cell(engine, ALLOCATE_FOREVER, heap_limit=1 << 30)
            assert run.error is not None
            assert run.error.startswith(
                "InternalError: out of memory: the code-mode host's heap budget of"
                f" {48 << 20} bytes is used up"
            )
            fresh = await run_cell(engine, 'text("fresh")')
            assert fresh.texts == ["fresh"]


async def test_invalid_limits_are_refused_with_their_names(provider: Provider) -> None:
    for limits, name in [
        (CellLimits(max_cpu_time_ms=0), "max_cpu_time_ms must be positive, got 0"),
        (CellLimits(max_stored_value_bytes=-1), "max_stored_value_bytes must be positive"),
        (CellLimits(max_pending_output_bytes=61 << 20), "max_pending_output_bytes must be"),
    ]:
        with pytest.raises(InvalidRequestError, match=re.escape(name)):
            await provider.create_session(limits)


# ---- CPU time ------------------------------------------------------------------------------


async def test_a_cell_past_its_cpu_time_ends_by_itself_without_committing(
    provider: Provider,
) -> None:
    session = await provider.create_session(CellLimits(max_cpu_time_ms=200))
    delegate = RecordingDelegate()
    with trio.fail_after(30):
        started = await execute(session, delegate, 'store("k", 1); while (true) {}')
        started.release()  # nobody observes it: it ends all the same
        outcome = await session.wait(WaitRequest(cell_id="1", yield_time_ms=LONG_MS))
        load = await run(session, RecordingDelegate(), 'text(String(load("k")))')
    assert isinstance(outcome, LiveCell)
    assert failure(outcome.response) == "exec cell exceeded its CPU time limit of 200 ms"
    assert texts(load) == ["undefined"]


@pytest.mark.slow
async def test_cpu_time_adds_up_over_many_short_turns(provider: Provider) -> None:
    session = await provider.create_session(CellLimits(max_cpu_time_ms=300))
    source = """
        while (true) {
            const until = Date.now() + 20;
            while (Date.now() < until) {}
            await new Promise((resolve) => setTimeout(resolve, 0));
        }
    """
    with trio.fail_after(30):
        response = await run(session, RecordingDelegate(), source)
    assert failure(response) == "exec cell exceeded its CPU time limit of 300 ms"


# ---- pending output ------------------------------------------------------------------------


async def test_text_past_the_pending_output_limit_throws_a_catchable_error(
    provider: Provider,
) -> None:
    session = await provider.create_session(CellLimits(max_pending_output_bytes=1000))
    source = """
        let printed = 0, error = null;
        try { while (true) { text("0123456789"); printed++; } } catch (e) { error = e; }
        yield_control();
        await tools.echo({});  // held until the response took the output: room again
        text(`${printed} ${error instanceof Error}`);
        text("after delivery");
    """
    with trio.fail_after(30):
        started = await execute(session, RecordingDelegate(), source, tools=[tool("echo")])
        first = await started.initial_response()
        # Each item counts its text and 64 bytes of framing: 13 fit in 1000 bytes.
        rest = await session.wait(WaitRequest(cell_id="1", yield_time_ms=LONG_MS))
        await still_serves(session)
    assert isinstance(first, Yielded)
    assert texts(first) == ["0123456789"] * 13
    assert rest == LiveCell(
        response=Completed(
            cell_id="1",
            content_items=[InputText(text="13 true"), InputText(text="after delivery")],
        )
    )


async def test_an_output_loop_yields_on_time_and_terminates_at_once(session: Session) -> None:
    source = 'while (true) { try { text("x"); } catch {} }'
    with trio.fail_after(30):
        started = await execute(session, RecordingDelegate(), source, yield_time_ms=100)
        begun = trio.current_time()
        first = await started.initial_response()
        yielded_after = trio.current_time() - begun
        begun = trio.current_time()
        outcome = await session.terminate("1")
        terminated_after = trio.current_time() - begun
        await still_serves(session)
    print(f"yielded after {yielded_after:.3f} s, terminated after {terminated_after:.3f} s")
    assert isinstance(first, Yielded)
    assert isinstance(outcome, LiveCell)
    assert isinstance(outcome.response, Terminated)


# ---- stored values -------------------------------------------------------------------------


async def test_a_store_past_the_stored_value_limit_throws(provider: Provider) -> None:
    session = await provider.create_session(CellLimits(max_stored_value_bytes=50))
    with trio.fail_after(30):
        first = await run(session, RecordingDelegate(), 'store("a", "x".repeat(20))')
        refused = await run(session, RecordingDelegate(), 'store("b", "y".repeat(40))')
        replaced = await run(
            session, RecordingDelegate(), 'store("a", "z".repeat(40)); text(load("a").length)'
        )
    assert isinstance(first, Completed)
    assert first.error_text is None
    assert failure(refused) == (
        'Unable to store "b". The session\'s stored values would exceed their limit of 50 bytes.'
    )
    assert texts(replaced) == ["40"]  # an overwrite counts the new value, not both


# ---- hostile shapes --------------------------------------------------------------------------


@pytest.mark.slow
async def test_deep_recursion_and_deep_json_fail_their_cell(session: Session) -> None:
    sources = [
        "function f() { return f() + 1; } f();",
        'JSON.parse("[".repeat(1e6) + "]".repeat(1e6));',
        "let o = {}; for (let i = 0; i < 1e6; i++) o = { o }; JSON.stringify(o);",
    ]
    with trio.fail_after(60):
        for source in sources:
            response = await run(session, RecordingDelegate(), source)
            assert failure(response)
        await still_serves(session)


async def test_a_set_timeout_storm_is_bounded(session: Session) -> None:
    source = """
        let set = 0;
        try { for (;;) { setTimeout(() => {}, 1e9); set++; } }
        catch (e) { text(`${set}: ${e}`); }
    """
    with trio.fail_after(60):
        response = await run(session, RecordingDelegate(), source)
        await still_serves(session)
    assert texts(response) == ["10000: setTimeout: too many pending timers (the limit is 10000)"]


async def test_cpu_time_is_reported_by_the_engine(engine: Engine) -> None:
    # A fixed amount of work (about 800 ms of CPU), not of wall time: on a loaded machine
    # 50 ms of wall time held less than the 10 ms of CPU the limit needs.
    run = await run_cell(engine, "for (let i = 0; i < 2e7; i++) {}", cpu_limit_ms=10)
    assert run.error == "exec cell exceeded its CPU time limit of 10 ms"
    await trio.testing.wait_all_tasks_blocked()


async def test_the_inventory_reports_the_cpu_time_the_engine_measured(session: Session) -> None:
    delegate = RecordingDelegate()
    delegate.hold_tools = True
    # A fixed amount of work, not of wall time: on a loaded machine 30 ms of wall time held
    # as little as 10 ms of CPU. Two million iterations take about 80 ms of CPU here.
    source = "let n = 0; for (let i = 0; i < 2e6; i++) { n += i; } await tools.echo({});"
    with trio.fail_after(30):
        started = await execute(session, delegate, source, tools=[tool("echo")])
        started.release()
        await delegate.until(lambda: len(delegate.invocations) == 1)
        # The turn that made the call has ended once the delegate saw the call; its Idle event
        # (with the CPU time) may still be on its way to the cell's task.
        while not (cells := await session.cells()) or cells[0].cpu_time_ms == 0:
            await trio.testing.wait_all_tasks_blocked()
        await session.terminate("1")
    print(f"cpu_time_ms={cells[0].cpu_time_ms}")
    assert cells[0].cpu_time_ms >= 20


@pytest.mark.slow
async def test_terminate_returns_soon_from_a_native_call_that_ignores_interrupts(
    session: Session,
) -> None:
    # A typed-array sort runs in C without polling the interrupt flag (about 2 s here): the
    # termination abandons its turn, and the session serves the next cell at once.
    source = """
        const numbers = new Float64Array(1e7).map(Math.random);
        text("sorting"); yield_control(); numbers.sort(); text("sorted");
    """
    with trio.fail_after(30):
        started = await execute(session, RecordingDelegate(), source)
        first = await started.initial_response()
        begun = trio.current_time()
        outcome = await session.terminate("1")
        took = trio.current_time() - begun
        await still_serves(session)
    print(f"terminate returned after {took:.3f} s")
    assert texts(first) == ["sorting"]
    assert outcome == LiveCell(response=Terminated(cell_id="1", content_items=[]))
    assert took < 1.0


@pytest.mark.slow
async def test_a_hundred_thousand_tool_calls_at_once_are_contained(provider: Provider) -> None:
    # The delegate answers each call at once; past the pending-call bound (1024) a call is
    # rejected at once, and the host keeps serving this session and the others.
    session = await provider.create_session()
    other = await provider.create_session()
    source = """
        const calls = [];
        for (let i = 0; i < 100000; i++) calls.push(tools.echo({ i }));
        const results = await Promise.allSettled(calls);
        const done = results.filter((r) => r.status === "fulfilled").length;
        const refused = results.filter(
            (r) => r.reason === "code-mode host has too many pending delegate calls"
        ).length;
        text(`${done + refused} ${refused > 0}`);
    """
    with trio.fail_after(120):
        started = await execute(session, RecordingDelegate(), source, tools=[tool("echo")])
        await still_serves(other)
        response = await started.initial_response()
        while isinstance(response, Yielded):
            outcome = await session.wait(WaitRequest(cell_id="1", yield_time_ms=LONG_MS))
            assert isinstance(outcome, LiveCell)
            assert not isinstance(outcome.response, codemode.Pending)
            response = outcome.response
        await still_serves(session)
    assert texts(response) == ["100000 true"]
