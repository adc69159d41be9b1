"""The engine binding: module evaluation, imports, values across the boundary, interrupts,
limits, and events published while a cell still runs (issue: the package and the engine)."""

from __future__ import annotations

import json
import os
import re

import msgspec
import pytest
import trio
import trio.testing
from codemode_host.engine import (
    MAX_STACK_LIMIT,
    CellEvent,
    CellTool,
    Engine,
    EngineClosedError,
    Finished,
    Idle,
    Notification,
    Outcome,
    Started,
    StoredValueWritten,
    TextOutput,
    ToolCallRequested,
    YieldRequested,
    open_engine,
)

from tests.helpers import ToolRejectedError, drive, ended, run_cell, wait_for, without_heap

MAX_SAFE_INTEGER = 9007199254740991


def is_finished(event: object) -> bool:
    return isinstance(event, Finished)


def without_idle(events: list[CellEvent]) -> list[CellEvent]:
    """The events but the end-of-turn reports, whose batching varies from run to run (and a
    `Finished` without its heap figure)."""
    return [without_heap(event) for event in events if not isinstance(event, Idle)]


# ---- evaluation ----------------------------------------------------------------------------


async def test_cell_evaluates_as_a_module_with_top_level_await(engine: Engine) -> None:
    run = await run_cell(
        engine,
        "const v = await Promise.resolve(41); text(v + 1); text(typeof this); text((function () { return typeof this; })())",
    )
    assert ended(run) == Finished(Outcome.OK, None)
    assert run.texts == ["42", "undefined", "undefined"]
    assert isinstance(run.events[0], Started)


async def test_module_scope_is_strict(engine: Engine) -> None:
    run = await run_cell(engine, "undeclared = 1")
    assert run.error is not None
    assert run.error.startswith("ReferenceError: undeclared is not defined\n    at ")


async def test_syntax_error_is_reported_with_its_name(engine: Engine) -> None:
    run = await run_cell(engine, "let = ;")
    assert run.finished.outcome is Outcome.ERROR
    assert run.error is not None
    assert run.error.startswith("SyntaxError: ")


async def test_top_level_return_is_a_syntax_error(engine: Engine) -> None:
    run = await run_cell(engine, "return 1")
    assert run.error is not None
    assert run.error.startswith("SyntaxError: ")


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('import x from "fs"; text(x)', "Unsupported import in exec: fs"),
        ('import { a } from "./local.js"', "Unsupported import in exec: ./local.js"),
        ('export * from "node:os"', "Unsupported import in exec: node:os"),
        ('await import("fs")', "Unsupported import in exec: fs"),
    ],
)
async def test_imports_are_refused(engine: Engine, source: str, expected: str) -> None:
    run = await run_cell(engine, source)
    assert ended(run) == Finished(Outcome.ERROR, expected)


async def test_refused_dynamic_import_can_be_caught(engine: Engine) -> None:
    run = await run_cell(engine, 'try { await import("x") } catch (e) { text(typeof e); text(e) }')
    assert run.texts == ["string", "Unsupported import in exec: x"]
    assert run.error is None


# ---- values across the boundary ----------------------------------------------------------


async def test_max_safe_integer_round_trips_exactly(engine: Engine) -> None:
    seen: list[object] = []

    async def echo(call: ToolCallRequested) -> object:
        assert call.input_json is not None
        value = msgspec.json.decode(call.input_json)
        seen.append(value)
        return value

    run = await run_cell(
        engine,
        f"""
        const big = {MAX_SAFE_INTEGER};
        text(big);
        const back = await tools.echo({{ n: big, neg: -big }});
        text(back.n === big && back.neg === -big);
        store("n", big);
        text(load("n") === big);
        """,
        tools=[CellTool("echo")],
        on_tool=echo,
    )
    assert run.error is None
    assert run.texts == [str(MAX_SAFE_INTEGER), "true", "true"]
    assert seen == [{"n": MAX_SAFE_INTEGER, "neg": -MAX_SAFE_INTEGER}]
    assert msgspec.json.decode(run.stores[0].value_json) == MAX_SAFE_INTEGER


async def test_strings_with_nul_round_trip_exactly(engine: Engine) -> None:
    seen: list[object] = []

    async def echo(call: ToolCallRequested) -> object:
        assert call.input_json is not None
        value = msgspec.json.decode(call.input_json)
        seen.append(value)
        return "x\u0000y"

    run = await run_cell(
        engine,
        r"""
        text("a\u0000b");
        const back = await tools.echo("c\u0000d");
        text(back.length === 3 && back.charCodeAt(1) === 0);
        store("k\u0000", "v\u0000");
        notify("n\u0000");
        """,
        tools=[CellTool("echo")],
        on_tool=echo,
    )
    assert run.error is None
    assert run.texts == ["a\u0000b", "true"]
    assert seen == ["c\u0000d"]
    assert run.stores == [StoredValueWritten("k\u0000", b'"v\\u0000"')]
    assert run.notifications == ["n\u0000"]


async def test_lone_surrogates_become_replacement_characters(engine: Engine) -> None:
    seen: list[object] = []

    async def echo(call: ToolCallRequested) -> object:
        assert call.input_json is not None
        seen.append(msgspec.json.decode(call.input_json))
        return None

    run = await run_cell(
        engine,
        r"""
        text("a\ud800b");
        text("pair \ud83d\ude00");
        await tools.echo({ s: "\udfff", pair: "\ud83d\ude00", escaped: "\\ud800" });
        store("k", "\ud800");
        """,
        tools=[CellTool("echo")],
        on_tool=echo,
    )
    assert run.error is None
    assert run.texts == ["a\ufffdb", "pair \U0001f600"]
    assert seen == [{"s": "\ufffd", "pair": "\U0001f600", "escaped": "\\ud800"}]
    assert msgspec.json.decode(run.stores[0].value_json) == "\ufffd"


# ---- events while the cell runs ----------------------------------------------------------


async def test_events_are_published_while_the_cell_still_computes(engine: Engine) -> None:
    source = """
        text("first");
        notify("note");
        store("k", 1);
        tools.t({});
        yield_control();
        while (true) {}
    """
    with trio.fail_after(10), engine.start_cell(source, tools=[CellTool("t")]) as cell:
        seen = await wait_for(cell, lambda e: isinstance(e, YieldRequested))
        assert isinstance(seen[0], Started)
        assert seen[0].setup_ns > 0
        assert without_idle(seen[1:]) == [
            TextOutput("first"),
            Notification("note"),
            StoredValueWritten("k", b"1"),
            ToolCallRequested(1, 0, b"{}"),
            YieldRequested(),
        ]
        cell.interrupt()
        rest = await wait_for(cell, is_finished)
        assert without_idle(rest) == [Finished(Outcome.INTERRUPTED, None)]


# ---- interrupts --------------------------------------------------------------------------

SPINNERS = {
    "busy-loop": 'text("spinning"); while (true) {}',
    "catch-and-retry": 'text("spinning"); while (true) { try { while (true) {} } catch (e) { text("caught") } }',
    "catastrophic-regex": 'text("spinning"); /(a+)+$/.test("a".repeat(32) + "b"); text("matched")',
    "async-loop": 'text("spinning"); while (true) { await null; }',
    "finally-loop": 'text("spinning"); for (;;) { try { for (;;) {} } finally { continue; } }',
}


@pytest.mark.parametrize("source", SPINNERS.values(), ids=SPINNERS.keys())
async def test_interrupt_stops_running_javascript(engine: Engine, source: str) -> None:
    with trio.fail_after(10), engine.start_cell(source) as cell:
        await wait_for(cell, lambda e: e == TextOutput("spinning"))
        cell.interrupt()
        rest = await wait_for(cell, is_finished)
        assert without_heap(rest[-1]) == Finished(Outcome.INTERRUPTED, None)
        assert TextOutput("caught") not in rest
        assert TextOutput("matched") not in rest


async def test_interrupt_from_another_thread(engine: Engine) -> None:
    with trio.fail_after(10), engine.start_cell('text("spinning"); while (true) {}') as cell:
        await wait_for(cell, lambda e: isinstance(e, TextOutput))
        await trio.to_thread.run_sync(cell.interrupt)
        rest = await wait_for(cell, is_finished)
        assert without_heap(rest[-1]) == Finished(Outcome.INTERRUPTED, None)


TEXT_RESULTS = [
    "",
    "plain",
    "[1, 2]",
    '"quoted"',
    "na\u00efve \u65e5\u672c \U0001f600",
    "nul\x00in",
    "a\nb\\",
]


async def test_a_text_result_reaches_the_cell_as_that_string(engine: Engine) -> None:
    # The text settles a call as the JSON of the same string would: JSON-looking text stays
    # text, and a code point above U+FFFF is two UTF-16 units, as in any JavaScript string.
    source = f"""
        const seen = [];
        for (let i = 0; i < {len(TEXT_RESULTS)}; i++) {{
          const s = await tools.t({{}});
          seen.push([typeof s, s, s.length]);
        }}
        text(JSON.stringify(seen));
    """
    with trio.fail_after(10), engine.start_cell(source, tools=[CellTool("t")]) as cell:
        for result in TEXT_RESULTS:
            events = await wait_for(cell, lambda e: isinstance(e, ToolCallRequested))
            [call] = [e for e in events if isinstance(e, ToolCallRequested)]
            cell.settle_tool_call_with_text(call.call_id, result.encode())
        events = await wait_for(cell, is_finished)
    [output] = [e.text for e in events if isinstance(e, TextOutput)]
    assert json.loads(output) == [
        ["string", result, len(result.encode("utf-16-le")) // 2] for result in TEXT_RESULTS
    ]
    assert without_heap(events[-1]) == Finished(Outcome.OK, None)


async def test_an_unknown_way_to_settle_is_refused(engine: Engine) -> None:
    with trio.fail_after(10), engine.start_cell("await tools.t()", tools=[CellTool("t")]) as cell:
        await wait_for(cell, lambda e: isinstance(e, ToolCallRequested))
        with pytest.raises(ValueError, match="settle must be 0"):
            cell._native.settle_tool(1, 4, b"x")
        cell.settle_tool_call_with_text(1, b"ok")
        events = await wait_for(cell, is_finished)
    assert without_heap(events[-1]) == Finished(Outcome.OK, None)


async def test_interrupt_of_an_idle_cell_reports_it_interrupted(engine: Engine) -> None:
    with trio.fail_after(10), engine.start_cell("await tools.t()", tools=[CellTool("t")]) as cell:
        await wait_for(cell, lambda e: isinstance(e, ToolCallRequested))
        cell.interrupt()
        rest = await wait_for(cell, is_finished)
        assert without_idle(rest) == [Finished(Outcome.INTERRUPTED, None)]
        # A late result for the interrupted cell changes nothing and raises nothing.
        cell.settle_tool_call(1, b"1")


async def test_closing_a_spinning_cell_frees_it(engine: Engine) -> None:
    with trio.fail_after(10):
        cell = engine.start_cell('text("spinning"); while (true) {}')
        await wait_for(cell, lambda e: isinstance(e, TextOutput))
        cell.close()
        cell.close()
        with pytest.raises(EngineClosedError):
            cell.fire_timer(1)
        # The engine keeps serving.
        run = await run_cell(engine, 'text("next")')
        assert run.texts == ["next"]


async def test_closing_the_engine_interrupts_spinning_cells() -> None:
    with trio.fail_after(10):
        async with open_engine(workers=2) as engine:
            cells = [engine.start_cell('text("spin"); for (;;) {}') for _ in range(3)]
            for cell in cells:
                await wait_for(cell, lambda e: isinstance(e, TextOutput))
        with pytest.raises(EngineClosedError):
            engine.start_cell("1")
        for cell in cells:
            cell.close()
        assert engine.live_cells == 0


async def test_trio_keeps_running_while_a_cell_spins(engine: Engine) -> None:
    # The worker runs the JS without the GIL, so this task is never starved.
    ticks = 0
    with trio.fail_after(10), engine.start_cell('text("spin"); while (true) {}') as cell:
        await wait_for(cell, lambda e: isinstance(e, TextOutput))
        for _ in range(20):
            await trio.lowlevel.checkpoint()
            ticks += 1
        cell.interrupt()
        await wait_for(cell, is_finished)
    assert ticks == 20


# ---- limits ------------------------------------------------------------------------------


async def test_heap_limit_fails_the_cell_and_the_engine_stays_healthy(engine: Engine) -> None:
    run = await run_cell(
        engine,
        'text("start"); const keep = []; while (true) keep.push("x".repeat(1000) + keep.length);',
        heap_limit=16 << 20,
    )
    assert run.texts == ["start"]
    assert run.finished.outcome is Outcome.ERROR
    assert run.error is not None
    assert "out of memory" in run.error
    fresh = await run_cell(engine, 'text("fresh")', heap_limit=16 << 20)
    assert fresh.texts == ["fresh"]
    assert fresh.error is None


async def test_heap_limit_error_can_be_caught_by_the_cell(engine: Engine) -> None:
    run = await run_cell(
        engine,
        """
        function grow() { const a = []; while (true) a.push({ i: a.length }); }
        try { grow(); } catch (e) { text("caught " + e); }
        text("still running");
        """,
        heap_limit=8 << 20,
    )
    assert run.error is None
    # QuickJS throws null when even the error object cannot be allocated.
    assert run.texts[0] in {"caught null", "caught InternalError: out of memory"}
    assert run.texts[-1] == "still running"


async def test_huge_string_hits_the_heap_limit(engine: Engine) -> None:
    run = await run_cell(
        engine, 'const s = "ab".repeat(2 ** 27); text(s.length)', heap_limit=32 << 20
    )
    assert run.finished.outcome is Outcome.ERROR
    assert run.error is not None
    assert "out of memory" in run.error


async def test_heap_limit_too_small_for_the_globals_fails_cleanly(engine: Engine) -> None:
    run = await run_cell(engine, 'text("never")', heap_limit=4096)
    assert run.finished.outcome is Outcome.ERROR
    assert run.texts == []


async def test_deep_recursion_is_a_range_error(engine: Engine) -> None:
    run = await run_cell(engine, "function f(n) { return f(n + 1) + 1; } f(0)")
    assert run.error is not None
    assert run.error.startswith("RangeError: Maximum call stack size exceeded\n    at f (")
    caught = await run_cell(
        engine,
        "function f(n) { return f(n + 1) + 1; } try { f(0) } catch (e) { text(e.name) } text('ok')",
    )
    assert caught.texts == ["RangeError", "ok"]


async def test_stack_limit_bounds_recursion_depth(engine: Engine) -> None:
    source = "let depth = 0; function f() { depth++; f(); } try { f() } catch { } text(depth)"
    small = await run_cell(engine, source, stack_limit=256 << 10)
    large = await run_cell(engine, source, stack_limit=MAX_STACK_LIMIT)
    assert 0 < int(small.texts[0]) < int(large.texts[0])


async def test_limits_are_validated(engine: Engine) -> None:
    with pytest.raises(ValueError, match="stack_limit"):
        engine.start_cell("1", stack_limit=MAX_STACK_LIMIT + 1)
    with pytest.raises(ValueError, match="heap_limit"):
        engine.start_cell("1", heap_limit=0)


# ---- error text --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('throw "x"', "x"),
        ("throw { a: 1 }", "[object Object]"),
        ("throw undefined", "undefined"),
        ("throw null", "null"),
        ("throw 42", "42"),
        ('throw { stack: "custom stack" }', "custom stack"),
        ('await Promise.reject("later")', "later"),
    ],
)
async def test_error_text_of_thrown_values(engine: Engine, source: str, expected: str) -> None:
    run = await run_cell(engine, source)
    assert ended(run) == Finished(Outcome.ERROR, expected)


async def test_error_text_has_a_header_and_frames(engine: Engine) -> None:
    run = await run_cell(
        engine, 'text("one"); text("two"); function boom() { throw new Error("boom"); } boom();'
    )
    assert run.texts == ["one", "two"]
    assert run.error is not None
    assert re.fullmatch(r"Error: boom\n(\s+at .+\n?)+", run.error), run.error
    assert "at boom (exec_main.mjs:" in run.error


async def test_error_thrown_after_await_keeps_its_frames(engine: Engine) -> None:
    run = await run_cell(engine, "await null; null.x")
    assert run.error is not None
    assert run.error.startswith("TypeError: cannot read property 'x' of null\n    at ")


async def test_unhandled_rejections_of_other_promises_are_ignored(engine: Engine) -> None:
    run = await run_cell(
        engine,
        'Promise.reject(new Error("ignored")); tools.fails(); text("done")',
        tools=[CellTool("fails")],
        on_tool=reject_all,
    )
    assert ended(run) == Finished(Outcome.OK, None)
    assert run.texts == ["done"]


async def reject_all(call: ToolCallRequested) -> object:
    raise ToolRejectedError("no")


async def test_microtasks_are_drained_after_each_tool_result(engine: Engine) -> None:
    run = await run_cell(
        engine,
        """
        const r = await tools.t();
        await null; await null;
        Promise.resolve().then(() => text("microtask"));
        text(r.value);
        """,
        tools=[CellTool("t")],
    )
    assert run.texts == ["output", "microtask"]


async def test_many_cells_run_in_parallel(engine: Engine) -> None:
    with trio.fail_after(20):
        cells = [engine.start_cell(f"text({i} * 2)") for i in range(64)]
        try:
            runs = [await drive(cell) for cell in cells]
        finally:
            for cell in cells:
                cell.close()
    assert [run.texts for run in runs] == [[str(i * 2)] for i in range(64)]


async def test_spinning_cells_do_not_starve_other_cells() -> None:
    with trio.fail_after(10):
        async with open_engine(workers=1) as engine:
            spinner = engine.start_cell('text("spin"); for (;;) {}')
            await wait_for(spinner, lambda e: isinstance(e, TextOutput))
            run = await run_cell(engine, 'text("served")')
            assert run.texts == ["served"]
            # At least one worker more than the spinner holds; a loaded machine that keeps a
            # worker off its CPU past the starvation delay may grow the pool further.
            assert engine.worker_threads >= 2
            spinner.close()


async def test_the_pool_grows_again_for_a_later_stall() -> None:
    # The monitor is woken only while it rests (nothing stalled): after it grew the pool once,
    # work queued behind a second spinner must still wake it, and cells queued while it
    # watches a stall are served by the worker it adds.
    with trio.fail_after(20):
        async with open_engine(workers=1) as engine:
            spinners = []
            for expected_workers in (2, 3):
                spinner = engine.start_cell('text("spin"); for (;;) {}')
                spinners.append(spinner)
                await wait_for(spinner, lambda e: isinstance(e, TextOutput))
                cells = [engine.start_cell(f"text({i})") for i in range(5)]
                for i, cell in enumerate(cells):
                    with cell:
                        events = await wait_for(cell, is_finished)
                    assert TextOutput(str(i)) in events
                    assert without_heap(events[-1]) == Finished(Outcome.OK, None), events
                # One worker more than the spinners hold (more when a loaded machine kept a
                # worker off its CPU past the starvation delay).
                assert engine.worker_threads >= expected_workers
            for spinner in spinners:
                spinner.close()


def engine_threads() -> list[tuple[str, int]]:
    """(name, scheduling policy) of this process's engine threads, sorted."""
    threads = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                name = comm.read().strip()
            policy = os.sched_getscheduler(int(task))
        except OSError:
            continue  # a thread that ended while we looked
        if name.startswith("codemode-"):
            threads.append((name, policy))
    return sorted(threads)


async def test_engine_threads_are_named_and_workers_do_not_preempt_their_wakers() -> None:
    # Engine rule 13: workers and the monitor run under SCHED_BATCH, so queuing a command does
    # not hand the queuing thread's CPU to the worker it wakes; the preparer only takes idle
    # CPU (rule 9).
    batch, idle = os.SCHED_BATCH, os.SCHED_IDLE
    before = engine_threads()  # another test's engine, if one is open, is not this one's

    def added() -> list[tuple[str, int]]:
        threads = engine_threads()
        for thread in before:
            threads.remove(thread)
        return threads

    with trio.fail_after(10):
        async with open_engine(workers=1, prepared_cells=1) as engine:
            assert added() == [
                ("codemode-prep", idle),
                ("codemode-watch", batch),
                ("codemode-worker", batch),
            ]
            # A worker the monitor adds (a spinner holds the first one) is one like the others.
            with engine.start_cell('text("spin"); for (;;) {}') as spinner:
                await wait_for(spinner, lambda e: isinstance(e, TextOutput))
                run = await run_cell(engine, 'text("served")')
                assert run.texts == ["served"]
                workers = engine.worker_threads
                assert workers >= 2
                assert added().count(("codemode-worker", batch)) == workers
    assert added() == []  # closing the engine joined them all


SUSPENDED = {
    "module-variable": "const p = new Promise(() => {}); await p;",
    "global": "globalThis.p = new Promise(() => {}); await p;",
    "prototype": "Object.prototype.keep = new Promise(() => {}); await Object.prototype.keep;",
    "nested-async": "async function f() { await new Promise(() => {}); } await f();",
    "tool-call": "await tools.t({});",
    "timer": "await new Promise((resolve) => setTimeout(resolve, 1e9));",
}


@pytest.mark.parametrize("source", SUSPENDED.values(), ids=SUSPENDED.keys())
@pytest.mark.parametrize("ending", ["close", "interrupt-then-close"])
async def test_freeing_a_cell_suspended_at_top_level_await(
    engine: Engine, source: str, ending: str
) -> None:
    """Regression: QuickJS-ng frees module records before a suspended module's callbacks; a
    build with CODEMODE_SANITIZE=1 reported a use-after-free here before cells stopped being
    evaluated as suspended modules (docs/engine.md, "Checking the binding")."""
    with trio.fail_after(10):
        cell = engine.start_cell(f'text("ready"); {source}', tools=[CellTool("t")])
        await wait_for(cell, lambda e: e == TextOutput("ready"))
        if ending == "interrupt-then-close":
            cell.interrupt()
            await wait_for(cell, is_finished)
        cell.close()
        run = await run_cell(engine, 'text("next")')
    assert run.texts == ["next"]


async def test_export_statements_are_syntax_errors(engine: Engine) -> None:
    run = await run_cell(engine, "export const x = 1;")
    assert run.error is not None
    assert run.error.startswith("SyntaxError: ")


async def test_stack_positions_are_the_sources_own(engine: Engine) -> None:
    run = await run_cell(engine, 'text("a");\nthrow new Error("line two");')
    assert run.error is not None
    assert run.error.splitlines()[1] == "    at <anonymous> (exec_main.mjs:2:11)"


LOST = "InternalError: the code-mode host ran out of memory for this cell's events"


@pytest.mark.parametrize(
    ("fault_after", "source", "texts"),
    [
        (0, 'text("a")', []),  # its Started event is lost
        (2, 'text("a"); text("b"); await new Promise(() => {})', ["a"]),
        (1, "text(await tools.t({}))", []),  # its tool call is lost: it would wait forever
    ],
    ids=["started", "output", "tool-call"],
)
async def test_a_lost_event_fails_the_cell_instead_of_hanging(
    fault_after: int, source: str, texts: list[str]
) -> None:
    # The allocation of an event fails (fault injection): the cell must end, with an error,
    # and its finish event can never be lost (it is allocated with the cell).
    async with open_engine(fault_events_after=fault_after) as engine:
        run = await run_cell(engine, source, tools=[CellTool(name="t")])
        assert engine.live_cells == 0
    assert run.texts == texts
    assert run.error == LOST


# ---- prepared runtimes ---------------------------------------------------------------------


async def test_a_cell_takes_a_prepared_runtime_and_the_pool_refills() -> None:
    async with open_engine(workers=1, prepared_cells=2) as engine:
        with trio.fail_after(10):
            assert await engine.wait_prepared()
            assert engine.prepared_cells == 2
            taken = engine.prepared_taken
            run = await run_cell(engine, 'text("from a prepared runtime")')
            assert run.texts == ["from a prepared runtime"]
            assert run.error is None
            assert engine.prepared_taken == taken + 1
            assert await engine.wait_prepared()  # the preparer refilled the pool
            assert engine.prepared_cells == 2
    assert engine.heap_total == 0  # closing freed the prepared runtimes too


async def test_the_pool_refills_while_the_cell_that_emptied_it_still_computes() -> None:
    # The worker that ran a start wakes the preparer after the turn (engine rule 15); a start
    # that takes the last prepared runtime wakes it at once, so a turn that never ends cannot
    # keep the pool empty. One worker spins and a CPU stays free for the preparer: it runs
    # under SCHED_IDLE (rule 9), and with every core spinning it got so little CPU that
    # under the sanitizers one refill outlasted the test's bound.
    async with open_engine(workers=1, prepared_cells=1) as engine:
        with trio.fail_after(10):
            assert await engine.wait_prepared()
            spinning = [engine.start_cell('text("spin"); while (true) {}')]
            for cell in spinning:
                await wait_for(cell, lambda event: isinstance(event, TextOutput))
            assert engine.prepared_taken == 1
            assert await engine.wait_prepared()
            assert engine.prepared_cells == 1
            for cell in spinning:
                cell.interrupt()
                await wait_for(cell, lambda event: isinstance(event, Finished))
                cell.close()


async def test_prepared_runtimes_take_each_cells_own_limits_and_configuration() -> None:
    async with open_engine(workers=1, prepared_cells=3) as engine:
        assert await engine.wait_prepared()
        limited = await run_cell(engine, ALLOCATE, heap_limit=8 << 20)
        assert limited.error is not None
        assert limited.error.startswith(
            f"InternalError: out of memory: exec cell exceeded its heap limit of {8 << 20} bytes"
        )
        source = "let depth = 0; function f() { depth++; f(); } try { f() } catch { } text(depth)"
        small = await run_cell(engine, source, stack_limit=256 << 10)
        large = await run_cell(engine, source, stack_limit=MAX_STACK_LIMIT)
        assert 0 < int(small.texts[0]) < int(large.texts[0])
        with engine.start_cell(
            "text([typeof store, typeof load].join(' '))", store_load=False
        ) as cell:
            run = await drive(cell)
        assert run.texts == ["undefined undefined"]


async def test_without_prepared_runtimes_each_cell_creates_its_own() -> None:
    async with open_engine(workers=1, prepared_cells=0) as engine:
        assert await engine.wait_prepared()
        assert engine.prepared_cells == 0
        run = await run_cell(engine, 'text("made on demand")')
        assert run.texts == ["made on demand"]
        assert (engine.prepared_cells, engine.prepared_taken) == (0, 0)


ALLOCATE = "const keep = []; while (true) keep.push(new Array(100000).fill(1));"
HOLD_128_KIB = 'globalThis.held = "x".repeat(128 << 10);'


async def test_memory_goes_back_to_the_system_once_no_cell_is_live() -> None:
    # glibc keeps what the cells freed in its per-thread arenas: a host that ran a thousand
    # cells kept their 200 MiB after they ended, until the engine trimmed. Each cell holds its
    # context (about 200 KB, less under AddressSanitizer) and a 128 KiB string: 120 of them free
    # more than the 16 MiB that start a trim.
    async with open_engine(workers=2) as engine:
        trims = engine.trims
        with trio.fail_after(30):
            cells = [
                engine.start_cell(f"{HOLD_128_KIB} await new Promise(() => {{}})")
                for _ in range(120)
            ]
            for cell in cells:
                await wait_for(cell, lambda event: isinstance(event, Idle))
            assert engine.trims == trims  # nothing is trimmed while cells live
            for cell in cells:
                cell.close()
            assert await engine.wait_trimmed(trims) > trims


KEEP_32_MIB = 'globalThis.keep = "x".repeat(32 << 20); text("kept")'


async def test_a_finished_cell_gives_its_heap_back_before_it_is_closed() -> None:
    # Rule 11: the worker frees the runtime at the end of the turn the cell finished in. With
    # one worker, the second cell's turn runs after the first one's ended, so the budget (48
    # MiB) holds the second 32 MiB string only if the first, unclosed, cell gave its own back.
    async with open_engine(workers=1, max_workers=1, heap_budget=48 << 20) as engine:
        with trio.fail_after(30):
            first = engine.start_cell(KEEP_32_MIB)
            events = await wait_for(first, lambda event: isinstance(event, Finished))
            assert isinstance(events[-1], Finished)
            assert events[-1].outcome is Outcome.OK
            second = engine.start_cell(KEEP_32_MIB)
            events = await wait_for(second, lambda event: isinstance(event, Finished))
            assert isinstance(events[-1], Finished), events
            assert events[-1].error_text is None
            first.close()
            second.close()
    assert engine.heap_total == 0


async def test_closing_the_last_finished_cell_starts_the_trim() -> None:
    # Finished cells need no worker to close (rule 11): the close of the last live one wakes
    # an idle worker for the trim of rule 10 all the same.
    async with open_engine(workers=2) as engine:
        trims = engine.trims
        with trio.fail_after(30):
            cells = [engine.start_cell(f'{HOLD_128_KIB} text("done")') for _ in range(120)]
            for cell in cells:
                await wait_for(cell, lambda event: isinstance(event, Finished))
            for cell in cells:
                cell.close()
            assert await engine.wait_trimmed(trims) > trims


HOLD_4_MIB = 'globalThis.keep = []; for (let i = 0; i < 4096; i++) keep.push("x".repeat(1000) + i);'


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.slow
async def test_a_finished_cells_blocks_are_all_freed() -> None:
    # Rule 12: freeing a runtime frees the list of its blocks, not each object. 200 cells that
    # each leave 4 MiB in their runtime, in thousands of blocks, would keep 800 MiB if the list
    # missed them; once trimmed, the process is back where it was.
    async with open_engine(workers=1, prepared_cells=0) as engine:
        with trio.fail_after(60):
            await run_cell(engine, HOLD_4_MIB)
            await trio.to_thread.run_sync(engine._native.trim)
            before = _rss()
            for _ in range(200):
                run = await run_cell(engine, HOLD_4_MIB)
                assert run.error is None, run.error
            await trio.to_thread.run_sync(engine._native.trim)
            grown = _rss() - before
    assert grown < 64 << 20, grown


async def test_a_handler_gets_every_event_in_order_and_finished_is_returned() -> None:
    async with open_engine() as engine:
        with trio.fail_after(30):
            texts: list[str] = []
            finishes: list[Finished] = []

            def handle(event: CellEvent) -> None:
                if isinstance(event, TextOutput):
                    texts.append(event.text)
                elif isinstance(event, Finished):
                    assert texts == [str(i) for i in range(50)]  # in order: output first
                    finishes.append(event)

            source = "for (let i = 0; i < 50; i++) { text(String(i)); await null; }"
            with engine.start_cell(source) as cell:
                finished = await cell.handle_until_finished(handle)
    assert finished is not None
    assert finished.outcome is Outcome.OK
    assert texts == [str(i) for i in range(50)]
    assert finishes == [finished]


async def test_a_handler_gets_what_was_published_before_it_was_set() -> None:
    # The cell finishes while nobody handles its events: the handler gets them all, its
    # `Finished` included, in the task that calls it.
    async with open_engine() as engine:
        with trio.fail_after(30):
            with engine.start_cell('text("early")') as cell:
                seen: list[CellEvent] = []
                while not any(isinstance(event, Finished) for event in cell._pending):
                    await trio.lowlevel.checkpoint()  # the collector files the events meanwhile
                finished = await cell.handle_until_finished(seen.append)
    assert [type(event) for event in seen] == [Started, TextOutput, Finished]
    assert seen[-1] is finished


async def test_stop_handling_ends_the_wait_without_finished_and_the_events_wait() -> None:
    # The runtime abandons a terminated turn that does not stop this way.
    async with open_engine() as engine:
        with trio.fail_after(30):
            source = 'text("one"); await new Promise(() => {})'
            with engine.start_cell(source) as cell:
                seen: list[CellEvent] = []

                async def stop_once_seen() -> None:
                    while not any(isinstance(event, TextOutput) for event in seen):
                        await trio.lowlevel.checkpoint()
                    cell.stop_handling()

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(stop_once_seen)
                    stopped = await cell.handle_until_finished(seen.append)
                cell.interrupt()
                later: list[CellEvent] = []  # no handler: they wait in the cell
                while not any(isinstance(event, Finished) for event in later):
                    later += await cell.next_events()
            finished = await run_cell(engine, 'text("two")')
    assert stopped is None
    assert [type(event) for event in seen[:2]] == [Started, TextOutput]
    assert isinstance(later[-1], Finished)
    assert finished.texts == ["two"]


async def test_a_failing_handler_fails_its_own_cell_task_only() -> None:
    # The handler runs in the collector's task, which serves every cell: its exception is
    # raised where the cell's events are awaited, and the other cells go on.
    async with open_engine() as engine:
        with trio.fail_after(30):

            def broken(event: CellEvent) -> None:
                text = event.text if isinstance(event, TextOutput) else None
                if text is not None:
                    raise LookupError(f"cannot handle {text}")

            source = 'await null; text("boom"); await new Promise(() => {})'
            with (
                engine.start_cell(source) as cell,
                pytest.raises(LookupError, match="cannot handle boom"),
            ):
                await cell.handle_until_finished(broken)
            run = await run_cell(engine, 'text("still served")')
    assert run.texts == ["still served"]


class Recording:
    """A handler that records every event, and sets `seen_one` at the first of type `until`."""

    def __init__(self, until: type[CellEvent]) -> None:
        self.seen: list[CellEvent] = []
        self.seen_one = trio.Event()
        self._until = until

    def __call__(self, event: CellEvent) -> None:
        self.seen.append(event)
        if isinstance(event, self._until):
            self.seen_one.set()


async def test_handle_events_needs_no_task_and_a_task_takes_over_without_repeats() -> None:
    # The runtime's cells run this way (rule 10 of `runtime/_cell.py`): their handler runs
    # in the collector with no task waiting, and a task takes over only when one is needed.
    async with open_engine() as engine:
        with trio.fail_after(30):
            source = 'text("one"); await tools.t({}); text("two")'
            with engine.start_cell(source, tools=[CellTool("t")]) as cell:
                handle = Recording(until=ToolCallRequested)
                seen = handle.seen
                cell.handle_events(handle, failed=lambda: None)
                await handle.seen_one.wait()  # handled in the collector: nobody awaited the cell
                taken_over = len(seen)
                async with trio.open_nursery() as nursery:
                    finished = trio.Event()

                    async def take_over() -> None:
                        assert await cell.handle_until_finished(handle) is seen[-1]
                        finished.set()

                    nursery.start_soon(take_over)
                    await trio.testing.wait_all_tasks_blocked()
                    call = next(e for e in seen if isinstance(e, ToolCallRequested))
                    cell.settle_tool_call(call.call_id, b"{}")
                    await finished.wait()
    texts = [event.text for event in seen if isinstance(event, TextOutput)]
    assert texts == ["one", "two"]
    assert [type(event) for event in seen[:taken_over]][:2] == [Started, TextOutput]
    assert sum(isinstance(event, Finished) for event in seen) == 1
    assert isinstance(seen[-1], Finished)


async def test_a_finished_handled_with_no_task_is_returned_to_a_later_task() -> None:
    async with open_engine() as engine:
        with trio.fail_after(30):
            with engine.start_cell('text("done")') as cell:
                handle = Recording(until=Finished)
                cell.handle_events(handle, failed=lambda: None)
                await handle.seen_one.wait()
                finished = await cell.handle_until_finished(handle)
    assert finished is handle.seen[-1]
    assert [type(event) for event in handle.seen] == [Started, TextOutput, Finished]


async def test_a_handler_failing_with_no_task_calls_failed_and_the_task_raises() -> None:
    async with open_engine() as engine:
        with trio.fail_after(30):

            def broken(event: CellEvent) -> None:
                text = event.text if isinstance(event, TextOutput) else None
                if text is not None:
                    raise LookupError(f"cannot handle {text}")

            failed = trio.Event()
            source = 'text("boom"); await new Promise(() => {})'
            with engine.start_cell(source) as cell:
                cell.handle_events(broken, failed.set)
                await failed.wait()
                with pytest.raises(LookupError, match="cannot handle boom"):
                    await cell.handle_until_finished(broken)
            run = await run_cell(engine, 'text("still served")')
    assert run.texts == ["still served"]


async def test_call_after_dispatch_runs_after_the_batch_in_the_collectors_step() -> None:
    async with open_engine() as engine:
        with trio.fail_after(30):
            assert not engine.call_after_dispatch(lambda: None)  # not in the collector
            seen: list[CellEvent] = []
            after: list[int] = []
            done = trio.Event()

            def handle(event: CellEvent) -> None:
                seen.append(event)
                if isinstance(event, Started):
                    assert engine.call_after_dispatch(lambda: after.append(len(seen)))
                if isinstance(event, Finished):
                    done.set()

            with engine.start_cell('text("one")') as cell:
                cell.handle_events(handle, failed=lambda: None)
                await done.wait()
    assert len(after) == 1
    assert after[0] >= 1  # the Started and whatever came in its batch, all handed out first


async def test_what_a_function_run_after_dispatch_raises_is_logged_and_the_engine_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with open_engine() as engine:
        with trio.fail_after(30):

            def broken() -> None:
                raise LookupError("after the batch")

            def handle(event: CellEvent) -> None:
                if isinstance(event, Started):
                    engine.call_after_dispatch(broken)

            with engine.start_cell('text("one")') as cell:
                cell.handle_events(handle, failed=lambda: None)
                while "after the batch" not in caplog.text:
                    await trio.lowlevel.checkpoint()
            run = await run_cell(engine, 'text("still served")')
    assert run.texts == ["still served"]


async def test_a_denied_call_rejects_with_an_error_of_the_cells_realm(engine: Engine) -> None:
    source = (
        "try { await tools.t() } catch (e) {"
        " text(String(e instanceof Error) + ' ' + Object.getPrototypeOf(e).constructor.name"
        " + ' ' + e.message) }"
    )
    with trio.fail_after(10), engine.start_cell(source, tools=[CellTool("t")]) as cell:
        await wait_for(cell, lambda e: isinstance(e, ToolCallRequested))
        cell.reject_tool_call_with_error(1, "tool tools.t was denied: no")
        events = await wait_for(cell, is_finished)
    texts = [event.text for event in events if isinstance(event, TextOutput)]
    assert texts == ["true Error tool tools.t was denied: no"]
