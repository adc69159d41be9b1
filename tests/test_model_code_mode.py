"""`CodeMode` end to end on both providers: yielding, waiting, terminating, errors and the two
API shapes, the tests of reference 9.10 that are about them, by name.

Every test drives a real session (in-process and in a host process, through the `provider`
fixture) and asserts what the model would see.
"""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import trio

import codemode
from codemode import (
    CodeMode,
    InputImage,
    InputText,
    JsonValue,
    NestedToolCall,
    ToolDefinition,
    ToolOutput,
)
from tests.conftest import Provider
from tests.delegates import RecordingDelegate
from tests.sessions import tool
from tests.test_seed_stdio import host_proxy

HEADER = re.compile(r"(Script [^\n]+)\nWall time \d+\.\d seconds\nOutput:\n")


def status_line(output: ToolOutput) -> str:
    first = output.items[0]
    assert isinstance(first, InputText)
    match = HEADER.fullmatch(first.text)
    assert match is not None, first.text
    return match.group(1)


def body(output: ToolOutput) -> list[str | InputImage]:
    """The items after the header: texts as strings, images as they are."""
    return [item.text if isinstance(item, InputText) else item for item in output.items[1:]]


async def open_code_mode(
    provider: Provider,
    delegate: RecordingDelegate,
    tools: Iterable[ToolDefinition] = (),
    **options: Any,
) -> CodeMode:
    return CodeMode(await provider.create_session(), delegate, tools, **options)


class Gates:
    """Tool calls that each wait for their own release."""

    def __init__(self) -> None:
        self.opened: dict[str, trio.Event] = {}

    def gate(self, call_id: str) -> trio.Event:
        return self.opened.setdefault(call_id, trio.Event())

    async def behaviour(self, call: NestedToolCall) -> JsonValue:
        await self.gate(call.runtime_tool_call_id).wait()
        return {}


async def test_code_mode_only_restricts_prompt_tools(provider: Provider) -> None:
    code_mode = await open_code_mode(provider, RecordingDelegate(), [tool("update_plan")])
    for api in ("openai", "anthropic"):
        assert [spec["name"] for spec in code_mode.tool_specs(api)] == ["exec", "wait"]
    assert "### `update_plan`" in code_mode.exec_description()
    assert code_mode.wait_description().startswith("Waits on a yielded `exec` cell")


async def test_code_mode_exec_outer_limit_truncates_emitted_output(provider: Provider) -> None:
    code_mode = await open_code_mode(provider, RecordingDelegate())
    source = '// @exec: {"max_output_tokens": 5}\ntext("0123456789".repeat(4))'
    with trio.fail_after(10):
        output = await code_mode.exec("call-1", source)
    assert body(output) == [
        "Warning: truncated output (original token count: 10)\nTotal output lines: 1\n\n"
        "0123456789…5 tokens truncated…0123456789"
    ]


async def test_code_mode_returns_accumulated_output_when_script_fails(
    provider: Provider,
) -> None:
    code_mode = await open_code_mode(provider, RecordingDelegate())
    source = 'text("one"); text("two"); throw new Error("boom");'
    with trio.fail_after(10):
        output = await code_mode.exec("call-1", source)
    assert status_line(output) == "Script failed"
    assert len(output.items) == 4
    assert body(output)[:2] == ["one", "two"]
    error = body(output)[2]
    assert isinstance(error, str)
    assert re.fullmatch(r"Script error:\nError: boom\n(\s+at .+\n?)+", error), error
    assert (output.success, output.status) == (False, "failed")


async def test_code_mode_can_yield_and_resume_with_wait(provider: Provider) -> None:
    gates = Gates()
    code_mode = await open_code_mode(
        provider, RecordingDelegate(on_tool=gates.behaviour), [tool("gate")]
    )
    source = """
        text("phase 1"); yield_control(); await tools.gate({});
        text("phase 2"); yield_control(); await tools.gate({});
        text("phase 3");
    """
    with trio.fail_after(10):
        first = await code_mode.exec("call-1", source)
        gates.gate("tool-1").set()
        # The tool's answer and this wait race to the host, and a `yield_control()` with no
        # observer attached is ignored (design.md, runtime 3.9): a window of 1 s delivers
        # "phase 2" when the wait attached after the yield, as the yield does when before.
        second = await code_mode.wait({"cell_id": "1", "yield_time_ms": 1_000})
        gates.gate("tool-2").set()
        third = await code_mode.wait({"cell_id": "1", "yield_time_ms": 60_000})
    assert [status_line(o) for o in (first, second, third)] == [
        "Script running with cell ID 1",
        "Script running with cell ID 1",
        "Script completed",
    ]
    assert [body(o) for o in (first, second, third)] == [["phase 1"], ["phase 2"], ["phase 3"]]
    assert [(o.status, o.cell_id, o.tool) for o in (first, second, third)] == [
        ("running", "1", "exec"),
        ("running", "1", "wait"),
        ("completed", "1", "wait"),
    ]


async def test_code_mode_yield_and_termination_are_not_starved_by_runtime_output(
    provider: Provider,
) -> None:
    code_mode = await open_code_mode(provider, RecordingDelegate())
    source = '// @exec: {"yield_time_ms": 0}\nfor (let i = 0; i < 16384; i++) text("x" + i); while (true) {}'
    with trio.fail_after(5):
        running = await code_mode.exec("call-1", source)
        stopped = await code_mode.wait({"cell_id": "1", "terminate": True})
    assert status_line(running) == "Script running with cell ID 1"
    assert len(running.items) == 1
    assert (stopped.status, status_line(stopped)) == ("terminated", "Script terminated")


async def test_code_mode_can_run_multiple_yielded_sessions(provider: Provider) -> None:
    code_mode = await open_code_mode(provider, RecordingDelegate())
    with trio.fail_after(10):
        first = await code_mode.exec(
            "call-1", 'text("a"); yield_control(); await new Promise(() => {})'
        )
        second = await code_mode.exec(
            "call-2", 'text("b"); yield_control(); await new Promise(() => {})'
        )
        for cell_id in ("1", "2"):
            await code_mode.wait({"cell_id": cell_id, "terminate": True})
    assert [status_line(first), status_line(second)] == [
        "Script running with cell ID 1",
        "Script running with cell ID 2",
    ]
    assert [body(first), body(second)] == [["a"], ["b"]]


async def test_code_mode_wait_can_terminate_and_continue(provider: Provider) -> None:
    code_mode = await open_code_mode(provider, RecordingDelegate())
    with trio.fail_after(10):
        await code_mode.exec("call-1", "yield_control(); while (true) {}")
        stopped = await code_mode.wait({"cell_id": "1", "terminate": True})
        after = await code_mode.exec("call-2", 'text("after")')
    assert len(stopped.items) == 1
    assert status_line(stopped) == "Script terminated"
    assert (stopped.success, stopped.cell_id) == (True, "1")
    assert (status_line(after), body(after), after.cell_id) == ("Script completed", ["after"], "2")


async def test_code_mode_wait_returns_error_for_unknown_session(provider: Provider) -> None:
    code_mode = await open_code_mode(provider, RecordingDelegate())
    with trio.fail_after(10):
        output = await code_mode.wait({"cell_id": "999999"})
    assert status_line(output) == "Script failed"
    assert body(output) == ["Script error:\nexec cell 999999 not found"]
    assert (output.success, output.status, output.cell_id) == (False, "failed", "999999")


async def test_code_mode_wait_terminate_returns_completed_session_if_it_finished_after_yield_control(
    provider: Provider,
) -> None:
    delegate = RecordingDelegate()
    code_mode = await open_code_mode(provider, delegate)
    with trio.fail_after(10):
        first = await code_mode.exec("call-1", 'yield_control(); text("finished"); notify("done")')
        await delegate.until(lambda: len(delegate.notifications) == 1)
        outcome = await code_mode.wait({"cell_id": "1", "terminate": True})
    assert body(first) == []
    # Completed if the cell finished before the terminate, Terminated if not: both carry it.
    assert status_line(outcome) in ("Script completed", "Script terminated")
    assert body(outcome) == ["finished"]


async def test_code_mode_background_keeps_running_on_later_turn_without_wait(
    provider: Provider,
) -> None:
    delegate = RecordingDelegate()
    code_mode = await open_code_mode(provider, delegate, [tool("side_effect")])
    source = "yield_control(); for (let i = 0; i < 3; i++) await tools.side_effect({ i });"
    with trio.fail_after(10):
        first = await code_mode.exec("call-1", source)
        await delegate.until(lambda: len(delegate.invocations) == 3)
    assert first.status == "running"
    assert [call.input for call in delegate.invocations] == [{"i": 0}, {"i": 1}, {"i": 2}]


async def test_code_mode_wait_uses_its_own_max_tokens_budget(provider: Provider) -> None:
    gates = Gates()
    code_mode = await open_code_mode(
        provider, RecordingDelegate(on_tool=gates.behaviour), [tool("gate")]
    )
    source = '// @exec: {"max_output_tokens": 1000}\nyield_control(); await tools.gate({}); text("0123456789".repeat(4))'
    with trio.fail_after(10):
        await code_mode.exec("call-1", source)
        gates.gate("tool-1").set()
        output = await code_mode.wait({"cell_id": "1", "yield_time_ms": 60_000, "max_tokens": 6})
    assert body(output) == [
        "Warning: truncated output (original token count: 10)\nTotal output lines: 1\n\n"
        "012345678901…4 tokens truncated…890123456789"
    ]


async def test_code_mode_can_output_serialized_text_via_global_helper(provider: Provider) -> None:
    code_mode = await open_code_mode(provider, RecordingDelegate())
    with trio.fail_after(10):
        output = await code_mode.exec("call-1", "text({ json: true })")
    assert body(output) == ['{"json":true}']


async def test_code_mode_notify_carries_the_exec_call_id(provider: Provider) -> None:
    # The reference host turns the notification into an extra `custom_tool_call_output` of the
    # exec call; codemode hands it to the delegate with that call id, and the app injects it.
    delegate = RecordingDelegate()
    code_mode = await open_code_mode(provider, delegate)
    with trio.fail_after(10):
        output = await code_mode.call("exec", "call_42", 'notify("working"); text("done")')
        await delegate.until(lambda: len(delegate.notifications) == 1)
    assert delegate.notifications == [("call_42", "1", "working")]
    assert body(output) == ["done"]


async def test_code_mode_surfaces_text_stringify_errors(provider: Provider) -> None:
    code_mode = await open_code_mode(provider, RecordingDelegate())
    with trio.fail_after(10):
        output = await code_mode.exec("call-1", "const a = {}; a.self = a; text(a);")
    assert status_line(output) == "Script failed"
    assert "Converting circular structure to JSON" in output.text


async def test_a_refused_pragma_starts_no_cell(provider: Provider) -> None:
    code_mode = await open_code_mode(provider, RecordingDelegate())
    with trio.fail_after(10):
        refused = await code_mode.exec("call-1", '// @exec: {"timeout": 1}\ntext("x")')
        blank = await code_mode.exec("call-2", "   ")
        started = await code_mode.exec("call-3", 'text("x")')
    assert refused == ToolOutput(
        items=[
            InputText(
                text="exec pragma only supports `yield_time_ms` and `max_output_tokens`; got `timeout`"
            )
        ],
        success=False,
        status="error",
    )
    assert blank.status == "error"
    assert started.cell_id == "1"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({}, "failed to parse function arguments: Object missing required field `cell_id`"),
        ({"cell_id": 1}, "failed to parse function arguments: Expected `str`, got `int` - at `$.cell_id`"),
        ({"cell_id": "1", "yield_time_ms": -1}, "failed to parse function arguments: Expected `int` >= 0 - at `$.yield_time_ms`"),
        ({"cell_id": "1", "yield_time_ms": 1.5}, "failed to parse function arguments: Expected an integer, got 1.5 - at `$.yield_time_ms`"),
        ('{"cell_id": "1", "max_tokens": 2.5e0}', "failed to parse function arguments: Expected an integer, got 2.5 - at `$.max_tokens`"),
        # The bounds WaitRequest and ExecuteRequest enforce, refused before any request.
        ({"cell_id": "1", "yield_time_ms": 2**63}, f"failed to parse function arguments: Expected `int` <= {2**63 - 1} - at `$.yield_time_ms`"),
        ('{"cell_id": "1", "yield_time_ms": 1e19}', f"failed to parse function arguments: Expected `int` <= {2**63 - 1} - at `$.yield_time_ms`"),
        ({"cell_id": "1", "max_tokens": 2**31}, f"failed to parse function arguments: Expected `int` <= {2**31 - 1} - at `$.max_tokens`"),
        ({"cell_id": "1", "max_tokens": "5"}, "failed to parse function arguments: Expected `int | null`, got `str` - at `$.max_tokens`"),
        ({"cell_id": "1", "terminate": "yes"}, "failed to parse function arguments: Expected `bool`, got `str` - at `$.terminate`"),
        ("{", "failed to parse function arguments: Input data was truncated"),
        ("[]", "failed to parse function arguments: Expected `object`, got `array`"),
        (7, "wait expects JSON arguments"),
    ],
)  # fmt: skip
async def test_bad_wait_arguments_are_tool_errors(
    provider: Provider, arguments: Any, message: str
) -> None:
    code_mode = await open_code_mode(provider, RecordingDelegate())
    with trio.fail_after(10):
        output = await code_mode.wait(arguments)
    assert output == ToolOutput(
        items=[InputText(text=message)], success=False, status="error", tool="wait"
    )


async def test_a_pragma_past_the_request_bounds_is_a_tool_error(provider: Provider) -> None:
    # A safe integer, so the pragma's own check passed it, but past ExecuteRequest's bound:
    # the model gets the text instead of the caller an InvalidRequestError.
    code_mode = await open_code_mode(provider, RecordingDelegate())
    with trio.fail_after(10):
        refused = await code_mode.exec(
            "call-1", '// @exec: {"max_output_tokens": 3000000000}\ntext("x")'
        )
        started = await code_mode.exec(
            "call-2", '// @exec: {"max_output_tokens": 2147483647}\ntext(1)'
        )
    assert refused == ToolOutput(
        items=[InputText(text="exec pragma field `max_output_tokens` must be at most 2147483647")],
        success=False,
        status="error",
    )
    assert (started.status, started.cell_id) == ("completed", "1")


async def test_integral_floats_are_accepted_where_the_specs_say_number(
    provider: Provider,
) -> None:
    # The wait spec types its numbers as JSON `number`; models send 1e3 or 1000.0.
    code_mode = await open_code_mode(provider, RecordingDelegate())
    with trio.fail_after(10):
        first = await code_mode.exec(
            "call-1", '// @exec: {"yield_time_ms": 0.0}\nawait new Promise(() => {})'
        )
        as_text = await code_mode.call("wait", "call-2", '{"cell_id": "1", "yield_time_ms": 1e1}')
        as_object = await code_mode.wait({"cell_id": "1", "yield_time_ms": 10.0, "max_tokens": 5e2})
        await code_mode.wait({"cell_id": "1", "terminate": True})
    assert [first.status, as_text.status, as_object.status] == ["running"] * 3


async def test_lone_surrogates_from_the_model_are_repaired(provider: Provider) -> None:
    # What an SDK's json.loads makes of a model's "\ud83d" escape: CodeMode.call raised
    # UnicodeEncodeError on the process provider (exec and wait) and in-process (wait).
    async def echo(call: NestedToolCall) -> JsonValue:
        return call.input

    delegate = RecordingDelegate(on_tool=echo)
    code_mode = await open_code_mode(provider, delegate, [tool("echo")])
    code = json.loads('"notify(\\"n\\ud83d\\"); text(\\"half \\ud83d\\")"')
    with trio.fail_after(10):
        executed = await code_mode.call("exec", "call\udc00", {"code": code})
        echoed = await code_mode.call("exec", "call-2", 'text(await tools.echo("x\\ud800"))')
        waited = await code_mode.call("wait", "call-3", {"cell_id": "1\ud800"})
        joined = await code_mode.call("exec", "call-4", 'text("\ud83d\ude00")')
    assert (executed.status, body(executed)) == ("completed", ["half \ufffd"])
    assert delegate.notifications == [("call\ufffd", "1", "n\ufffd")]
    assert (echoed.status, body(echoed)) == ("completed", ["x\ufffd"])
    assert (waited.status, body(waited)) == (
        "failed",
        ["Script error:\nexec cell 1\ufffd not found"],
    )
    assert body(joined) == ["\U0001f600"]


async def test_call_dispatches_both_api_shapes(provider: Provider) -> None:
    code_mode = await open_code_mode(provider, RecordingDelegate())
    with trio.fail_after(10):
        openai_exec = await code_mode.call(
            "exec", "call_1", 'text("a"); yield_control(); await new Promise(() => {})'
        )
        anthropic_exec = await code_mode.call("exec", "toolu_2", {"code": 'text("b")'})
        openai_wait = await code_mode.call("wait", "call_3", '{"cell_id": "1", "terminate": true}')
        anthropic_wait = await code_mode.call("wait", "toolu_4", {"cell_id": "2"})
        not_code = await code_mode.call("exec", "toolu_5", {"source": "x"})
    assert (openai_exec.status, body(openai_exec)) == ("running", ["a"])
    assert (anthropic_exec.status, body(anthropic_exec)) == ("completed", ["b"])
    assert (openai_wait.status, openai_wait.tool) == ("terminated", "wait")
    assert body(anthropic_wait) == ["Script error:\nexec cell 2 not found"]
    assert not_code == ToolOutput(
        items=[InputText(text="exec expects raw JavaScript source text")],
        success=False,
        status="error",
    )
    with pytest.raises(ValueError, match="code mode has no tool named 'shell'"):
        await code_mode.call("shell", "call_6", "ls")
    assert CodeMode.tool_names == ("exec", "wait")


async def test_a_busy_cell_is_a_tool_error(provider: Provider) -> None:
    gates = Gates()
    delegate = RecordingDelegate(on_tool=gates.behaviour)
    code_mode = await open_code_mode(provider, delegate, [tool("gate")])
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(code_mode.exec, "call-1", "await tools.gate({})")
            await delegate.until(lambda: len(delegate.invocations) == 1)
            busy = await code_mode.wait({"cell_id": "1"})
            gates.gate("tool-1").set()
    assert busy == ToolOutput(
        items=[InputText(text="exec cell 1 already has an active observer")],
        success=False,
        status="error",
        cell_id="1",
        tool="wait",
    )


async def test_a_session_shutting_down_is_a_tool_error(provider: Provider) -> None:
    session = await provider.create_session()
    code_mode = CodeMode(session, RecordingDelegate(), [])
    with trio.fail_after(10):
        await session.shutdown()
        output = await code_mode.exec("call-1", 'text("x")')
    assert output.items == [InputText(text="code mode session is shutting down")]
    assert (output.status, output.cell_id) == ("error", None)


def test_negative_options_are_refused() -> None:
    for option in ("min_yield_time_ms", "max_empty_wait_ms"):
        with pytest.raises(ValueError, match=f"{option} must not be negative, got -1"):
            CodeMode(None, RecordingDelegate(), [], **{option: -1})  # type: ignore[arg-type]


@pytest.mark.slow
async def test_started_cell_preserves_remote_initial_response_errors(tmp_path: Path) -> None:
    # The host dies while the exec awaits its first response: the error's text reaches the
    # model as it is, as a tool-level error about the cell it started.
    proxy, pid_path = host_proxy(tmp_path)
    delegate = RecordingDelegate()
    delegate.hold_tools = True
    outputs: list[ToolOutput] = []
    async with codemode.open_process_provider([str(proxy)]) as provider:
        code_mode = CodeMode(await provider.create_session(), delegate, [tool("block")])

        async def run() -> None:
            outputs.append(await code_mode.exec("call-1", "await tools.block({})"))

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run)
                await delegate.until(lambda: len(delegate.invocations) == 1)
                os.kill(int(pid_path.read_text()), signal.SIGKILL)
    [output] = outputs
    assert (output.status, output.success, output.cell_id) == ("error", False, "1")
    first, journal = output.text.splitlines()
    assert re.fullmatch(r"code-mode host (exited with status -9|closed its stdout)", first)
    # The call that was running when the host died may have taken effect (the journal line).
    assert journal == (
        "Tool calls before the cell stopped: tools.block (call 1) was running and may have"
        " taken effect."
    )
