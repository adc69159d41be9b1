"""A cancelled `exec` (or `call`) terminates the cell it started: no one else knows its id."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from codemode import CodeMode, ToolOutput
from tests.conftest import Provider
from tests.delegates import RecordingDelegate
from tests.sessions import tool

SOURCE = 'text("started"); await tools.block({}); text("never")'


async def cancel_while_running(
    provider: Provider, start: Callable[[CodeMode], Awaitable[ToolOutput]]
) -> tuple[RecordingDelegate, CodeMode]:
    """Start an exec, cancel it once its cell is blocked in a tool call, return when closed."""
    delegate = RecordingDelegate()
    delegate.hold_tools = True
    code_mode = CodeMode(await provider.create_session(), delegate, [tool("block")])
    finished: list[ToolOutput] = []

    async def run() -> None:
        finished.append(await start(code_mode))

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            await delegate.until(lambda: len(delegate.invocations) == 1)
            nursery.cancel_scope.cancel()
        await delegate.until(lambda: delegate.closed == ["1"])
    assert finished == []
    assert delegate.cancelled_tools == ["tool-1"]
    return delegate, code_mode


async def test_cancelling_exec_terminates_the_cell(provider: Provider) -> None:
    _, code_mode = await cancel_while_running(
        provider, lambda code_mode: code_mode.exec("call-1", SOURCE)
    )
    with trio.fail_after(10):
        after = await code_mode.wait({"cell_id": "1"})
        again = await code_mode.exec("call-2", 'text("next")')
    assert after.status == "failed"
    assert after.text.endswith("Script error:\nexec cell 1 not found")
    assert (again.cell_id, again.status) == ("2", "completed")


async def test_cancelling_call_terminates_the_cell(provider: Provider) -> None:
    await cancel_while_running(
        provider, lambda code_mode: code_mode.call("exec", "toolu_1", {"code": SOURCE})
    )


async def test_a_finished_exec_leaves_its_yielded_cell_running(provider: Provider) -> None:
    # Only an exec cancelled before it returned stops its cell: a returned cell id is the
    # model's to wait on.
    delegate = RecordingDelegate()
    code_mode = CodeMode(await provider.create_session(), delegate, [])
    with trio.fail_after(10):
        running = await code_mode.exec("call-1", "yield_control(); await new Promise(() => {})")
        still = await code_mode.wait({"cell_id": "1", "yield_time_ms": 0})
        stopped = await code_mode.wait({"cell_id": "1", "terminate": True})
        await delegate.until(lambda: delegate.closed == ["1"])
    assert (running.status, still.status, stopped.status) == ("running", "running", "terminated")
