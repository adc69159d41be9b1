"""The end-to-end behaviours of design.md, runtime 9.10 that belong to the runtime (the host's
formatting and truncation belong to the model layer), through the public API."""

from __future__ import annotations

import gc
import json
import os
import re

import pytest
import trio

import codemode
from codemode import (
    Completed,
    InputText,
    JsonValue,
    LiveCell,
    MissingCell,
    NestedToolCall,
    Session,
    Terminated,
    ToolDefinition,
    ToolError,
    ToolKind,
    ToolName,
    WaitRequest,
    Yielded,
)
from tests.delegates import RecordingDelegate
from tests.sessions import LONG_MS, execute, run, texts, tool


def wait_request(cell_id: str, yield_time_ms: int = LONG_MS) -> WaitRequest:
    return WaitRequest(cell_id=cell_id, yield_time_ms=yield_time_ms)


class Gates:
    """Tool calls that each wait for their own release."""

    def __init__(self) -> None:
        self.opened: dict[str, trio.Event] = {}

    def gate(self, call_id: str) -> trio.Event:
        return self.opened.setdefault(call_id, trio.Event())

    async def behaviour(self, call: NestedToolCall) -> JsonValue:
        await self.gate(call.runtime_tool_call_id).wait()
        return {"value": call.runtime_tool_call_id}


async def test_code_mode_can_yield_and_resume_with_wait(session: Session) -> None:
    gates = Gates()
    delegate = RecordingDelegate(on_tool=gates.behaviour)
    source = """
        text("phase 1"); yield_control(); await tools.gate({});
        text("phase 2"); yield_control(); await tools.gate({});
        text("phase 3");
    """
    with trio.fail_after(10):
        first = await run(session, delegate, source, tools=[tool("gate")])
        gates.gate("tool-1").set()
        # The tool's answer and this wait race to the host, and a `yield_control()` with no
        # observer attached is ignored (design.md, runtime 3.9): a window of 1 s delivers
        # "phase 2" when the wait attached after the yield, as the yield does when before.
        second = await session.wait(wait_request("1", yield_time_ms=1_000))
        gates.gate("tool-2").set()
        third = await session.wait(wait_request("1"))
    assert first == Yielded(cell_id="1", content_items=[InputText(text="phase 1")])
    assert second == LiveCell(
        response=Yielded(cell_id="1", content_items=[InputText(text="phase 2")])
    )
    assert third == LiveCell(
        response=Completed(cell_id="1", content_items=[InputText(text="phase 3")])
    )


async def test_code_mode_yield_and_termination_are_not_starved_by_runtime_output(
    session: Session, delegate: RecordingDelegate
) -> None:
    source = 'for (let i = 0; i < 16384; i++) text("x" + i); while (true) {}'
    with trio.fail_after(5):
        first = await run(session, delegate, source, yield_time_ms=0)
        outcome = await session.terminate("1")
    assert first == Yielded(cell_id="1", content_items=[])
    assert isinstance(outcome, LiveCell)
    assert isinstance(outcome.response, Terminated)


async def test_code_mode_can_run_multiple_yielded_sessions(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(10):
        first = await run(
            session, delegate, 'text("a"); yield_control(); await new Promise(() => {})'
        )
        second = await run(
            session, delegate, 'text("b"); yield_control(); await new Promise(() => {})'
        )
        await session.terminate("1")
        await session.terminate("2")
    assert first == Yielded(cell_id="1", content_items=[InputText(text="a")])
    assert second == Yielded(cell_id="2", content_items=[InputText(text="b")])


async def test_code_mode_concurrent_cells_merge_only_the_stored_values_they_write(
    session: Session,
) -> None:
    gates = Gates()
    delegate = RecordingDelegate(on_tool=gates.behaviour)
    with trio.fail_after(10):
        await run(session, delegate, 'store("a", 1); store("b", 2)')
        cell_a = await execute(
            session, delegate, 'store("a", 3); await tools.gate({})', tools=[tool("gate")]
        )
        await delegate.until(lambda: len(delegate.invocations) == 1)
        cell_b = await run(session, delegate, 'store("b", 4)')
        assert isinstance(cell_b, Completed)
        gates.gate("tool-1").set()
        assert isinstance(await cell_a.initial_response(), Completed)
        merged = await run(
            session, delegate, 'text(JSON.stringify({ a: load("a"), b: load("b") }))'
        )
    assert texts(merged) == ['{"a":3,"b":4}']


async def test_code_mode_wait_can_terminate_and_continue(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(10):
        await run(session, delegate, "while (true) {}", yield_time_ms=0)
        outcome = await session.terminate("1")
        after = await run(session, delegate, 'text("after")')
    assert outcome == LiveCell(response=Terminated(cell_id="1", content_items=[]))
    assert after == Completed(cell_id="2", content_items=[InputText(text="after")])


async def test_code_mode_wait_returns_error_for_unknown_session(session: Session) -> None:
    with trio.fail_after(10):
        outcome = await session.wait(wait_request("999999"))
    assert outcome == MissingCell(
        response=Completed(
            cell_id="999999", content_items=[], error_text="exec cell 999999 not found"
        )
    )


async def test_code_mode_wait_terminate_returns_completed_session_if_it_finished_after_yield_control(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(10):
        first = await run(session, delegate, 'yield_control(); text("finished")')
        outcome = await session.terminate("1")
    assert first == Yielded(cell_id="1", content_items=[])
    # Completed if the cell finished before the terminate, Terminated if not: both carry it.
    assert isinstance(outcome, LiveCell)
    assert isinstance(outcome.response, Completed | Terminated)


async def test_code_mode_background_keeps_running_on_later_turn_without_wait(
    session: Session, delegate: RecordingDelegate
) -> None:
    source = "yield_control(); for (let i = 0; i < 3; i++) await tools.side_effect({ i });"
    with trio.fail_after(10):
        first = await run(session, delegate, source, tools=[tool("side_effect")])
        await delegate.until(lambda: len(delegate.invocations) == 3)
    assert first == Yielded(cell_id="1", content_items=[])
    assert [call.input for call in delegate.invocations] == [{"i": 0}, {"i": 1}, {"i": 2}]


async def test_code_mode_can_output_serialized_text_via_global_helper(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(10):
        response = await run(session, delegate, "text({ json: true })")
    assert texts(response) == ['{"json":true}']


async def test_code_mode_can_resume_after_set_timeout_and_compare_elapsed_time(
    session: Session, delegate: RecordingDelegate
) -> None:
    source = """
        const start = Date.now();
        await new Promise((resolve) => setTimeout(resolve, 100));
        text(Date.now() - start >= 100);
    """
    with trio.fail_after(10):
        response = await run(session, delegate, source)
    assert texts(response) == ["true"]


async def test_code_mode_notify_reaches_the_delegate_out_of_band(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(10):
        response = await run(session, delegate, 'notify("working on it"); text("done")')
        await delegate.until(lambda: len(delegate.notifications) == 1)
    assert delegate.notifications == [("call-1", "1", "working on it")]
    assert texts(response) == ["done"]


async def test_code_mode_exit_stops_script_immediately(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(10):
        response = await run(session, delegate, 'text("before"); exit(); text("after")')
    assert response == Completed(cell_id="1", content_items=[InputText(text="before")])


async def test_code_mode_surfaces_text_stringify_errors(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(10):
        response = await run(session, delegate, "const a = {}; a.a = a; text(a)")
    assert isinstance(response, Completed)
    assert response.error_text is not None
    assert "Converting circular structure to JSON" in response.error_text


async def test_code_mode_nested_tool_calls_can_run_in_parallel(session: Session) -> None:
    both_in_flight = trio.Event()
    in_flight = 0

    async def barrier(call: NestedToolCall) -> JsonValue:
        nonlocal in_flight
        in_flight += 1
        if in_flight == 2:
            both_in_flight.set()
        await both_in_flight.wait()
        return call.runtime_tool_call_id

    delegate = RecordingDelegate(on_tool=barrier)
    with trio.fail_after(10):
        response = await run(
            session,
            delegate,
            "text(await Promise.all([tools.slow({}), tools.slow({})]))",
            tools=[tool("slow")],
        )
    assert texts(response) == ['["tool-1","tool-2"]']


async def test_code_mode_returns_accumulated_output_when_script_fails(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(10):
        response = await run(session, delegate, 'text("one"); text("two"); throw new Error("boom")')
    assert isinstance(response, Completed)
    assert texts(response) == ["one", "two"]
    assert response.error_text is not None
    assert re.fullmatch(r"Error: boom\n(\s+at .+\n?)+", response.error_text)


async def test_code_mode_exec_surfaces_handler_errors_as_exceptions(session: Session) -> None:
    async def reject(call: NestedToolCall) -> JsonValue:
        raise ToolError("tool `t` expects a JSON object for arguments")

    delegate = RecordingDelegate(on_tool=reject)
    source = 'try { await tools.t("not an object"); } catch (e) { text("caught: " + e); }'
    with trio.fail_after(10):
        response = await run(session, delegate, source, tools=[tool("t")])
    assert texts(response) == ["caught: tool `t` expects a JSON object for arguments"]


async def test_code_mode_can_store_and_load_values_across_turns(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(10):
        await run(session, delegate, 'store("nb", { title: "Notebook", items: [1, true, null] })')
        response = await run(session, delegate, 'text(load("nb"))')
    assert texts(response) == ['{"title":"Notebook","items":[1,true,null]}']


async def test_code_mode_exposes_normalized_illegal_mcp_tool_names(
    session: Session, delegate: RecordingDelegate
) -> None:
    echo = ToolDefinition(
        name="mcp__rmcp__echo-tool",
        tool_name=ToolName.namespaced("mcp__rmcp__", "echo-tool"),
        description="Echo.",
    )
    with trio.fail_after(10):
        response = await run(
            session,
            delegate,
            "text(ALL_TOOLS.map((t) => t.name)); text((await tools.mcp__rmcp__echo_tool({})).value)",
            tools=[echo],
        )
    assert texts(response) == ['["mcp__rmcp__echo_tool"]', "output"]
    assert delegate.invocations == [
        NestedToolCall(
            cell_id="1",
            runtime_tool_call_id="tool-1",
            tool_name=ToolName(name="echo-tool", namespace="mcp__rmcp__"),
            tool_kind=ToolKind.FUNCTION,
            input={},
        )
    ]


async def test_a_tool_named_proto_is_an_own_property_of_tools(
    session: Session, delegate: RecordingDelegate
) -> None:
    # `tools.__proto__ = f` made the tool the prototype of `tools` (no own property, and
    # `tools.call` and `tools.bind` appeared).
    source = """
        text(JSON.stringify(Object.getOwnPropertyNames(tools)));
        text(Object.getPrototypeOf(tools) === Object.prototype);
        text(typeof tools.call + " " + typeof tools.bind);
        text((await tools.__proto__({n: 1})).value);
        text((await tools["__proto__"]({n: 2})).value);
        text(JSON.stringify(Object.getOwnPropertyDescriptor(tools, "__proto__"), ["writable", "enumerable", "configurable"]));
    """
    with trio.fail_after(10):
        response = await run(session, delegate, source, tools=[tool("__proto__"), tool("echo")])
    assert texts(response) == [
        '["__proto__","echo"]',
        "true",
        "undefined undefined",
        "output",
        "output",
        '{"writable":true,"enumerable":true,"configurable":true}',
    ]
    assert [call.input for call in delegate.invocations] == [{"n": 1}, {"n": 2}]


async def test_code_mode_freeform_tool_gets_its_text_and_empty_object_results(
    session: Session,
) -> None:
    async def empty(call: NestedToolCall) -> JsonValue:
        return {}

    delegate = RecordingDelegate(on_tool=empty)
    patch = ToolDefinition(
        name="apply_patch", tool_name=ToolName.plain("apply_patch"), kind=ToolKind.FREEFORM
    )
    with trio.fail_after(10):
        response = await run(
            session, delegate, 'text(await tools.apply_patch("*** Begin Patch"))', tools=[patch]
        )
    assert texts(response) == ["{}"]
    assert delegate.invocations[0].input == "*** Begin Patch"
    assert delegate.invocations[0].tool_kind is ToolKind.FREEFORM


STRING_RESULTS = ["", "plain", "[1, 2]", "na\u00efve \U0001f600", "nul\x00in", "x" * 100_000]


async def test_a_string_result_arrives_as_that_string(session: Session) -> None:
    # A string result skips JSON on its way into the cell; the cell cannot tell.
    results = iter(STRING_RESULTS)

    async def strings(call: NestedToolCall) -> JsonValue:
        return next(results)

    source = f"""
        const seen = [];
        for (let i = 0; i < {len(STRING_RESULTS)}; i++) {{
          const s = await tools.t({{}});
          seen.push([typeof s, s.length, s.slice(0, 20)]);
        }}
        text(JSON.stringify(seen));
    """
    with trio.fail_after(10):
        response = await run(session, RecordingDelegate(on_tool=strings), source, tools=[tool("t")])
    assert [json.loads(text) for text in texts(response)] == [
        [["string", len(s.encode("utf-16-le")) // 2, s[:20]] for s in STRING_RESULTS]
    ]


async def test_a_string_result_with_a_lone_surrogate_rejects_the_call(session: Session) -> None:
    async def broken(call: NestedToolCall) -> JsonValue:
        return "a\ud800"

    source = "try { await tools.t({}); text('resolved'); } catch (e) { text(String(e)); }"
    with trio.fail_after(10):
        response = await run(session, RecordingDelegate(on_tool=broken), source, tools=[tool("t")])
    [rejection] = texts(response)
    assert "surrogates not allowed" in rejection, rejection


async def test_a_tool_error_with_a_lone_surrogate_rejects_the_call(session: Session) -> None:
    # It used to escape the in-process provider as an exception (the rejection's text was
    # encoded strictly on its way into the engine).
    async def broken(call: NestedToolCall) -> JsonValue:
        raise codemode.ToolError("bad \ud800 text")

    source = "try { await tools.t({}); text('resolved'); } catch (e) { text(String(e)); }"
    with trio.fail_after(10):
        response = await run(session, RecordingDelegate(on_tool=broken), source, tools=[tool("t")])
        after = await run(session, RecordingDelegate(), "text('still serving')")
    [rejection] = texts(response)
    # In-process the surrogate reaches the cell and leaves it as U+FFFD (engine rule 6); the
    # process provider's client repairs it so before the wire: both reject alike.
    assert rejection == "bad \ufffd text"
    assert texts(after) == ["still serving"]


async def test_code_mode_mcp_error_results_are_values_not_rejections(session: Session) -> None:
    async def failing(call: NestedToolCall) -> JsonValue:
        return {"content": [{"type": "text", "text": "bad"}], "isError": True}

    delegate = RecordingDelegate(on_tool=failing)
    with trio.fail_after(10):
        response = await run(
            session,
            delegate,
            "const r = await tools.mcp({}); text(r.isError); text(r.content[0].text)",
            tools=[tool("mcp")],
        )
    assert texts(response) == ["true", "bad"]


async def test_tools_that_are_not_enabled_cannot_be_called(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(10):
        response = await run(
            session, delegate, "text(ALL_TOOLS.length); await tools.hidden({})", tools=[]
        )
    assert isinstance(response, Completed)
    assert texts(response) == ["0"]
    assert response.error_text is not None
    assert response.error_text.startswith("TypeError: tools.hidden is not a function")


async def test_code_mode_lists_global_scope_items(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(10):
        response = await run(session, delegate, "text(Object.getOwnPropertyNames(globalThis))")
    names = set(texts(response)[0].strip("[]").replace('"', "").split(","))
    assert {"text", "tools", "ALL_TOOLS", "store", "load", "exit"} <= names
    assert not names & {"console", "print", "std", "os", "performance"}


def _threads_and_fds() -> tuple[int, int]:
    gc.collect()  # what earlier tests dropped must not count here
    return len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd"))


@pytest.mark.slow
async def test_provider_leaves_no_threads_or_file_descriptors() -> None:
    # A first lifetime warms what may legitimately stay (trio's idle worker thread cache).
    async with codemode.open_in_process_provider():
        pass
    before = _threads_and_fds()
    for _ in range(3):
        async with codemode.open_in_process_provider() as provider:
            session = await provider.create_session()
            delegate = RecordingDelegate()
            with trio.fail_after(10):
                await run(session, delegate, "for (;;) {}", yield_time_ms=0)
                await run(session, delegate, 'text("done")')
    assert _threads_and_fds() == before


GARBAGE_SOURCES = [
    'await tools.t({}); text("ok")',
    'notify("n"); await new Promise((resolve) => setTimeout(resolve, 1)); text(1)',
    'throw new Error("boom")',
    'store("k", 1); text(load("k"))',
]


@pytest.mark.slow
async def test_ended_cells_leave_no_cyclic_garbage(session: Session) -> None:
    # Every cell's objects were a reference cycle (the cell and its calls' `accepting`
    # closure): under 64 sessions the host's cyclic collector found about 40 objects a cell
    # and ran for about 55 ms every second or so. Ended cells are freed by reference counts.
    delegate = RecordingDelegate()
    ours: list[str] = []
    with trio.fail_after(20):
        for _ in range(2):  # the first round warms what stays (caches, the session's books)
            gc.collect()
            gc.set_debug(gc.DEBUG_SAVEALL)
            try:
                for source in GARBAGE_SOURCES:
                    await run(session, delegate, source, tools=[tool("t")])
                spinning = await run(session, delegate, "for (;;) {}", yield_time_ms=0)
                assert spinning.cell_id is not None
                await session.terminate(spinning.cell_id)
                gc.collect()
                ours = [
                    type(o).__qualname__
                    for o in gc.garbage
                    if type(o).__module__.startswith("codemode")  # codemode_host too
                ]
            finally:
                gc.set_debug(0)
                gc.garbage.clear()
    assert ours == []
