"""Tools that misbehave never take an agent down: stuck sync tools, tools that raise
`SystemExit` or other `BaseException`s, stray `trio.Cancelled`, tools that ignore cancellation,
blocking notification handlers. Every test runs on both providers, against the real engine
(and the real host process)."""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import signal
import threading
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from functools import partial
from typing import Any

import anyio
import pytest
import trio

import codemode
import codemode.process
from codemode import (
    CodeMode,
    Completed,
    ExecuteRequest,
    NestedToolCall,
    Session,
    ToolThreadLimits,
    ToolThreadStatistics,
)
from codemode._trio import CLEANUP_GRACE
from tests.sessions import texts, tool

pytestmark = pytest.mark.slow

Opener = Callable[..., AbstractAsyncContextManager[Any]]
OPENERS: dict[str, Opener] = {
    "in-process": codemode.open_in_process_provider,
    "process": codemode.open_process_provider,
}

PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgAAAA"
    "AgABkp0hvAAAAABJRU5ErkJggg=="
)


@pytest.fixture(params=list(OPENERS))
def opener(request: pytest.FixtureRequest) -> Opener:
    return OPENERS[request.param]


class Gate:
    """Sync tools that block until the test opens the gate, counted as they enter."""

    def __init__(self, token: trio.lowlevel.TrioToken) -> None:
        self._token = token
        self._open = threading.Event()
        self._lock = threading.Lock()
        self._entered = 0
        self._wanted = 0
        self._reached = trio.Event()

    def block(self) -> None:
        with self._lock:
            self._entered += 1
            reached = self._entered == self._wanted
        if reached:
            self._token.run_sync_soon(self._reached.set)
        self._open.wait(60)

    async def until_entered(self, count: int) -> None:
        with self._lock:
            self._wanted = count
            if self._entered >= count:
                return
        await self._reached.wait()

    def open(self) -> None:
        self._open.set()


async def until_no_abandoned(statistics: Callable[[], ToolThreadStatistics]) -> None:
    # A thread's return reaches trio through a callback no event marks: poll the count (bounded
    # by the test's fail_after).
    while statistics().abandoned:  # noqa: ASYNC110
        await trio.sleep(0.01)


def blocking_toolbox(gate: Gate) -> codemode.Toolbox:
    toolbox = codemode.Toolbox()

    @toolbox.tool
    def hang() -> str:
        """Blocks until released (a network read that never answers)."""
        gate.block()
        return "released"

    @toolbox.tool
    def quick() -> str:
        """Returns at once."""
        return "quick"

    return toolbox


async def stuck_cells(session: Session, toolbox: codemode.Toolbox, count: int) -> list[str]:
    """Start `count` cells, each stuck in `tools.hang()`."""
    ids = []
    for index in range(count):
        request = ExecuteRequest(
            tool_call_id=f"stuck-{index}",
            source="await tools.hang()",
            enabled_tools=toolbox.definitions(),
            yield_time_ms=0,
        )
        started = await session.execute(request, toolbox, observe_initial=False)
        ids.append(started.cell_id)
    return ids


async def test_41_stuck_sync_tools_leave_every_other_thread_user_working(opener: Opener) -> None:
    gate = Gate(trio.lowlevel.current_trio_token())
    toolbox = blocking_toolbox(gate)
    try:
        with trio.fail_after(60):
            async with opener(tool_threads=ToolThreadLimits(max_running=41)) as provider:
                session = await provider.create_session()
                cells = await stuck_cells(session, toolbox, 41)
                await gate.until_entered(41)
                assert provider.tool_thread_statistics().running == 41
                for cell_id in cells:
                    await session.terminate(cell_id)
                stats = provider.tool_thread_statistics()
                assert (stats.running, stats.abandoned) == (0, 41)

                # A fresh sync tool, an image cell (prepared on trio's default limiter), the
                # application's own DNS lookup and anyio's threads all still work.
                mode = CodeMode(session, toolbox, toolbox.definitions())
                output = await mode.exec("fresh", "text(await tools.quick())")
                assert output.status == "completed"
                assert output.text.endswith("quick"), output.text
                output = await mode.exec("image", f'image("{PNG}"); text("done")')
                assert output.status == "completed", output.text
                assert await trio.socket.getaddrinfo("localhost", 80)
                assert await anyio.to_thread.run_sync(lambda: 1) == 1

                gate.open()
                await until_no_abandoned(provider.tool_thread_statistics)
    finally:
        gate.open()


async def test_past_the_abandoned_cap_a_sync_tool_fails_at_once(opener: Opener) -> None:
    gate = Gate(trio.lowlevel.current_trio_token())
    toolbox = blocking_toolbox(gate)
    limits = ToolThreadLimits(max_running=4, max_abandoned=2)
    try:
        with trio.fail_after(30):
            async with opener(tool_threads=limits) as provider:
                session = await provider.create_session()
                cells = await stuck_cells(session, toolbox, 2)
                await gate.until_entered(2)
                for cell_id in cells:
                    await session.terminate(cell_id)
                assert provider.tool_thread_statistics() == ToolThreadStatistics(
                    running=0, waiting=0, abandoned=2, limits=limits
                )
                mode = CodeMode(session, toolbox, toolbox.definitions())
                output = await mode.exec(
                    "capped", "try { await tools.quick() } catch (e) { text(String(e)) }"
                )
                assert output.text.endswith(
                    "tool quick was not run: 2 threads of cancelled tool calls are still running"
                    " (the limit is 2)"
                ), output.text

                gate.open()
                await until_no_abandoned(provider.tool_thread_statistics)
                output = await mode.exec("again", "text(await tools.quick())")
                assert output.text.endswith("quick"), output.text
    finally:
        gate.open()


def exiting_toolbox() -> codemode.Toolbox:
    toolbox = codemode.Toolbox()

    @toolbox.tool
    def parse(command: str) -> dict[str, Any]:
        """Parses a command line with argparse, which calls sys.exit on bad input."""
        parser = argparse.ArgumentParser(prog="cmd")
        parser.add_argument("--n", type=int)
        return vars(parser.parse_args(command.split()))

    @toolbox.tool
    def fetch_async() -> str:
        """Runs an asyncio client whose request task is cancelled."""

        async def inner() -> None:
            task = asyncio.ensure_future(asyncio.sleep(10))
            asyncio.get_running_loop().call_soon(task.cancel)
            await task

        asyncio.run(inner())
        return "unreachable"

    return toolbox


async def test_a_tool_raising_system_exit_rejects_only_its_call(opener: Opener) -> None:
    toolbox = exiting_toolbox()
    with trio.fail_after(30):
        async with opener() as provider:
            other = CodeMode(await provider.create_session(), codemode.Toolbox(), [])
            assert (await other.exec("o1", 'store("k", "precious")')).status == "completed"

            mode = CodeMode(await provider.create_session(), toolbox, toolbox.definitions())
            output = await mode.exec(
                "c",
                'text(JSON.stringify(await tools.parse({command: "--n 3"})));\n'
                'try { await tools.parse({command: "--n x"}) } catch (e) { text("caught " + e) }\n'
                "try { await tools.fetch_async() } catch (e) { text(String(e)) }",
            )
            assert output.status == "completed", output.text
            lines = output.text.splitlines()[-3:]
            assert lines == [
                '{"n":3}',
                "caught tool parse failed: SystemExit: 2",
                "tool fetch_async failed: CancelledError",
            ]
            output = await other.exec("o2", 'text(load("k"))')
            assert output.text.endswith("precious")


class Raising:
    """A raw `SessionDelegate` whose tool raises what `make` makes."""

    def __init__(self, make: Callable[[], BaseException]) -> None:
        self._make = make

    async def invoke_tool(self, call: NestedToolCall) -> None:
        await trio.lowlevel.checkpoint()
        raise self._make()

    async def notify(self, call_id: str, cell_id: str, text: str) -> None:
        raise self._make()

    def cell_closed(self, cell_id: str) -> None:
        raise self._make()


class Custom(BaseException):
    pass


async def raise_stray_cancelled() -> None:
    """Re-raise a `trio.Cancelled` outside the scope it belonged to (a stray one)."""
    with trio.CancelScope() as scope:
        scope.cancel()
        try:
            await trio.lowlevel.checkpoint()
        except trio.Cancelled as error:
            caught = error
    raise caught


async def test_async_tool_raising_a_stray_cancelled_is_a_failed_call(opener: Opener) -> None:
    toolbox = codemode.Toolbox()

    @toolbox.tool
    async def leaky() -> str:
        """Re-raises a Cancelled outside the scope it belonged to."""
        await raise_stray_cancelled()
        return "unreachable"

    with trio.fail_after(30):
        async with opener() as provider:
            mode = CodeMode(await provider.create_session(), toolbox, toolbox.definitions())
            output = await mode.exec(
                "c", "try { await tools.leaky() } catch (e) { text(String(e)) }\ntext('after')"
            )
            assert output.status == "completed", output.text
            failure, after = output.text.splitlines()[-2:]
            assert failure.startswith("tool leaky failed: Cancelled"), failure
            assert after == "after"
        reached_the_end_of_the_block = True
    assert reached_the_end_of_the_block


TOOL = tool("t", "t")


@pytest.mark.parametrize(
    ("make", "text"),
    [
        (lambda: SystemExit(3), "tool t failed: SystemExit: 3"),
        (KeyboardInterrupt, "tool t failed: KeyboardInterrupt"),
        (Custom, "tool t failed: Custom"),
        (asyncio.CancelledError, "tool t failed: CancelledError"),
        (lambda: ExceptionGroup("eg", [ValueError("v")]), "tool t failed: eg (1 sub-exception)"),
    ],
    ids=["SystemExit", "KeyboardInterrupt", "BaseException", "asyncio", "ExceptionGroup"],
)
async def test_a_raw_delegate_raising_any_exception_fails_only_its_call(
    opener: Opener, make: Callable[[], BaseException], text: str
) -> None:
    with trio.fail_after(30):
        async with opener() as provider:
            session = await provider.create_session()
            request = ExecuteRequest(
                tool_call_id="c",
                source='notify("n"); try { await tools.t({}) } catch (e) { text(String(e)) }',
                enabled_tools=[TOOL],
            )
            started = await session.execute(request, Raising(make))
            response = await started.initial_response()
            assert isinstance(response, Completed)
            assert texts(response) == [text]
            mode = CodeMode(session, codemode.Toolbox(), [])
            assert (await mode.exec("next", "text(1)")).status == "completed"


class Stray:
    """A raw `SessionDelegate` whose tool re-raises a `trio.Cancelled` outside its scope."""

    async def invoke_tool(self, call: NestedToolCall) -> None:
        await raise_stray_cancelled()

    async def notify(self, call_id: str, cell_id: str, text: str) -> None:
        pass

    def cell_closed(self, cell_id: str) -> None:
        pass


async def test_a_raw_delegate_raising_a_stray_cancelled_fails_only_its_call(
    opener: Opener,
) -> None:
    with trio.fail_after(30):
        async with opener() as provider:
            session = await provider.create_session()
            request = ExecuteRequest(
                tool_call_id="c",
                source="try { await tools.t({}) } catch (e) { text(String(e)) }",
                enabled_tools=[TOOL],
            )
            started = await session.execute(request, Stray())
            response = await started.initial_response()
            assert isinstance(response, Completed)
            (text,) = texts(response)
            assert text.startswith("tool t failed: Cancelled"), text
            mode = CodeMode(session, codemode.Toolbox(), [])
            assert (await mode.exec("next", "text(1)")).status == "completed"
        after_the_block = True
    assert after_the_block


async def test_leaving_the_block_abandons_tools_that_ignore_cancellation(
    opener: Opener, caplog: pytest.LogCaptureFixture
) -> None:
    gate = Gate(trio.lowlevel.current_trio_token())
    toolbox = codemode.Toolbox()

    @toolbox.tool
    async def fetch() -> str:
        """Wraps a blocking call the usual way (trio waits for the thread when cancelled)."""
        await trio.to_thread.run_sync(gate.block)
        return "fetched"

    try:
        with trio.fail_after(30):
            async with opener() as provider:
                mode = CodeMode(await provider.create_session(), toolbox, toolbox.definitions())
                output = await mode.exec("c", '// @exec: {"yield_time_ms": 0}\nawait tools.fetch()')
                assert output.status == "running"
                await gate.until_entered(1)
                terminated = await mode.wait({"cell_id": output.cell_id, "terminate": True})
                assert terminated.status == "terminated"
                leaving = trio.current_time()
            left_after = trio.current_time() - leaving
        # The documented bound (docs/limits.md): the sessions' shutdown (nothing left to shut
        # down here), then at most the cleanup grace for the abandoned call.
        assert left_after < CLEANUP_GRACE + 1.0
        assert "left 1 delegate calls behind" in caplog.text
    finally:
        gate.open()


async def test_a_plain_on_notify_runs_in_a_thread(opener: Opener) -> None:
    answered = threading.Event()
    threads: list[str] = []

    def on_notify(cell_id: str, text: str) -> None:
        threads.append(threading.current_thread().name)
        # On the trio thread this would wait out its timeout: the loop could not answer.
        assert answered.wait(20)

    async def answer(started: trio.Event) -> None:
        await started.wait()
        answered.set()

    toolbox = codemode.Toolbox(on_notify=on_notify)

    @toolbox.tool
    async def ping() -> str:
        """Returns at once."""
        return "pong"

    with trio.fail_after(30):
        async with opener() as provider, trio.open_nursery() as nursery:
            started = trio.Event()
            nursery.start_soon(answer, started)
            mode = CodeMode(await provider.create_session(), toolbox, toolbox.definitions())
            started.set()
            output = await mode.exec("c", 'notify("a"); text(await tools.ping())')
            assert output.text.endswith("pong")
    assert threads
    assert threading.main_thread().name not in threads


def host_pid(provider: codemode.process.ProcessProvider) -> int:
    (host,) = provider.statistics().hosts
    assert host.pid is not None
    return host.pid


async def test_a_callers_deadline_bounds_terminate_on_a_stopped_host() -> None:
    with trio.fail_after(30):
        async with codemode.open_process_provider() as provider:
            session = await provider.create_session()
            mode = CodeMode(session, codemode.Toolbox(), [])
            output = await mode.exec("c", '// @exec: {"yield_time_ms": 0}\nwhile (true) {}')
            pid = host_pid(provider)
            os.kill(pid, signal.SIGSTOP)  # a wedged host: it answers nothing
            try:
                assert output.cell_id is not None
                with trio.move_on_after(0.5) as bounded:
                    await session.terminate(output.cell_id)
                assert bounded.cancelled_caught
            finally:
                os.kill(pid, signal.SIGCONT)
            # The host was not blamed for the caller's bound: the same link, the same cell ids.
            assert host_pid(provider) == pid
            # (the retired terminate still reached it: the loop ended)
            assert (await mode.exec("next", "text(1)")).cell_id == "2"


async def test_a_cancelled_exec_does_not_wait_on_a_dead_host() -> None:
    with trio.fail_after(30):
        async with codemode.open_process_provider() as provider:
            session = await provider.create_session()
            toolbox = codemode.Toolbox()
            entered = trio.Event()

            @toolbox.tool
            async def wait_forever() -> str:
                """Never returns."""
                entered.set()
                await trio.sleep(math.inf)
                return "unreachable"

            mode = CodeMode(session, toolbox, toolbox.definitions())
            async with trio.open_nursery() as nursery:

                async def kill_then_cancel() -> None:
                    await entered.wait()
                    os.kill(host_pid(provider), signal.SIGKILL)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(kill_then_cancel)
                started = trio.current_time()
                await mode.exec("c", "await tools.wait_forever()")
            # The clean-up terminate met a dead link: it failed at once (no 60 s wait).
            assert trio.current_time() - started < 5.0


class Quiet:
    def __init__(self) -> None:
        self.notified = 0

    async def invoke_tool(self, call: NestedToolCall) -> None:
        return None

    async def notify(self, call_id: str, cell_id: str, text: str) -> None:
        self.notified += 1
        await trio.sleep(0.001)  # a slow handler: notifications pile up past the admission

    def cell_closed(self, cell_id: str) -> None:
        pass


async def test_a_notify_flood_logs_once_per_cell(
    opener: Opener, caplog: pytest.LogCaptureFixture
) -> None:
    with trio.fail_after(60):
        async with opener() as provider:
            session = await provider.create_session()
            request = ExecuteRequest(
                tool_call_id="c",
                source='for (let i = 0; i < 3000; i++) notify("n" + i); text("sent")',
            )
            quiet = Quiet()
            started = await session.execute(request, quiet)
            response = await started.initial_response()
            assert texts(response) == ["sent"]
    # In-process the runtime logs; the process provider relays the host's log lines.
    lines = [r.getMessage() for r in caplog.records if "notification" in r.getMessage()]
    assert len(lines) == 2, lines[:5]
    assert "further drops are counted when it closes" in lines[0]
    # Every notification is delivered or counted as dropped. How many are delivered depends
    # on the engine's speed: the first 1,024 fill the admission, and more get through when
    # the collector hands out the cell's events while it still runs (a slow or sanitized
    # engine), so the count is not a constant.
    assert quiet.notified >= 1024
    assert f"dropped {3000 - quiet.notified} notifications of exec cell 1 in all" in lines[1]


async def test_initial_response_after_the_block_raises_provider_closed(opener: Opener) -> None:
    with trio.fail_after(30):
        async with opener() as provider:
            session = await provider.create_session()
            started = await session.execute(
                ExecuteRequest(tool_call_id="c", source="while (true) {}"), Quiet()
            )
        with pytest.raises(codemode.ProviderClosedError):
            await started.initial_response()


async def test_leaving_the_block_needs_none_of_trios_default_threads(opener: Opener) -> None:
    gate = Gate(trio.lowlevel.current_trio_token())
    tokens = int(trio.to_thread.current_default_thread_limiter().total_tokens)
    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as application:
                async with opener() as provider:  # (spawning a host takes a default thread)
                    mode = CodeMode(await provider.create_session(), codemode.Toolbox(), [])
                    assert (await mode.exec("c", "text(1)")).status == "completed"
                    # Then the application's own thread work holds every default thread.
                    for _ in range(tokens):
                        blocked = partial(
                            trio.to_thread.run_sync, gate.block, abandon_on_cancel=True
                        )
                        application.start_soon(blocked)
                    await gate.until_entered(tokens)
                    assert (await mode.exec("d", "text(2)")).status == "completed"
                application.cancel_scope.cancel()
    finally:
        gate.open()
