"""`codemode.aio`: the providers, sessions and `CodeMode` for asyncio applications, on a trio
guest run hosted by the asyncio loop.

Each test is a plain function that runs its own asyncio loop (`asyncio.run`), bounded by
`asyncio.timeout`; the application's tools are asyncio coroutines. The session contract runs
here too, as a third flavour beside trio's (`test_the_contract`): on the in-process provider, a
process provider and a remote provider connected to a real listening host.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import pytest
import sniffio
import trio

import codemode
import codemode.aio as aio
from codemode import (
    CellLimits,
    Completed,
    ExecuteRequest,
    InputText,
    LiveCell,
    MissingCell,
    Terminated,
    WaitRequest,
    Yielded,
)
from codemode.aio._bridge import Bridge, open_bridge
from tests.remote_hosts import SharedHost
from tests.sessions import SETTLE

LONG_MS = 60_000


def run_on_asyncio(main: Callable[[], Coroutine[Any, Any, None]], seconds: float = 30) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(seconds):
            await main()

    asyncio.run(bounded())


def texts(response: Yielded | Completed | Terminated) -> list[str]:
    return [item.text for item in response.content_items if isinstance(item, InputText)]


class Application:
    """An asyncio application's tools, with what they saw."""

    def __init__(self) -> None:
        self.toolbox = codemode.Toolbox()
        self.loop_threads: list[bool] = []  # per async call: ran in an asyncio task
        self.sync_threads: list[str] = []
        self.cancelled: list[str] = []
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.closed: list[str] = []

        @self.toolbox.tool
        async def lookup(city: str) -> float:
            """The temperature of a city, from an asyncio service."""
            self.loop_threads.append(asyncio.current_task() is not None)
            await asyncio.sleep(0)
            return {"Lima": 19.0, "Oslo": -2.0}[city]

        @self.toolbox.tool
        def convert(celsius: float) -> float:
            """Celsius to Fahrenheit, in a plain function (the provider's threads)."""
            self.sync_threads.append(threading.current_thread().name)
            return celsius * 9 / 5 + 32

        @self.toolbox.tool
        async def slow(label: str) -> str:
            """Waits for the application to release it."""
            self.started.set()
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled.append(label)
                raise
            return label

        @self.toolbox.tool
        async def broken() -> str:
            """Always fails."""
            raise ValueError("the service is down")

        @self.toolbox.tool
        async def refusing() -> str:
            """Always refuses."""
            raise codemode.ToolError("not today")

    @property
    def tools(self) -> list[codemode.ToolDefinition]:
        return self.toolbox.definitions()


TWO_TOOLS = """\
const celsius = await tools.lookup({ city: "Lima" });
text(`celsius ${celsius}`);
yield_control();
text(`fahrenheit ${await tools.convert({ celsius })}`);
"""


@asynccontextmanager
async def opened(kind: str, remote_address: str = "") -> AsyncIterator[aio.Provider]:
    if kind == "in-process":
        async with aio.open_in_process_provider() as provider:
            yield provider
    elif kind == "process":
        async with aio.open_process_provider() as provider:
            yield provider
    else:
        async with aio.open_remote_provider([remote_address]) as provider:
            yield provider


PROVIDERS = ["in-process", pytest.param("process", marks=pytest.mark.slow)]


@pytest.mark.parametrize("kind", PROVIDERS)
def test_a_cell_calls_asyncio_tools_before_and_after_a_yield(kind: str) -> None:
    app = Application()

    async def main() -> None:
        async with opened(kind) as provider:
            session = await provider.create_session()
            request = ExecuteRequest(
                tool_call_id="call-1",
                source=TWO_TOOLS,
                enabled_tools=app.tools,
                yield_time_ms=LONG_MS,
            )
            started = await session.execute(request, app.toolbox)
            first = await started.initial_response()
            assert isinstance(first, Yielded)
            assert texts(first) == ["celsius 19"]
            outcome = await session.wait(WaitRequest(cell_id=started.cell_id))
            assert isinstance(outcome, LiveCell)
            assert isinstance(outcome.response, Completed)
            assert texts(outcome.response) == ["fahrenheit 66.2"]

    run_on_asyncio(main)
    assert app.loop_threads == [True]
    assert len(app.sync_threads) == 1
    assert app.sync_threads[0] != threading.main_thread().name


@pytest.mark.parametrize("kind", PROVIDERS)
def test_code_mode_answers_the_model_and_failing_tools_reject_their_promise(kind: str) -> None:
    app = Application()
    source = """\
for (const call of [() => tools.broken(), () => tools.refusing()]) {
  try { await call(); } catch (error) { text(String(error)); }
}
"""

    async def main() -> None:
        async with opened(kind) as provider:
            code_mode = aio.CodeMode(await provider.create_session(), app.toolbox, app.tools)
            assert [spec["name"] for spec in code_mode.tool_specs("openai")] == ["exec", "wait"]
            assert "lookup(args: { city: string; })" in code_mode.exec_description()
            first = await code_mode.call("exec", "call-1", TWO_TOOLS)
            assert (first.status, first.cell_id) == ("running", "1")
            assert first.text.endswith("celsius 19")
            second = await code_mode.call("wait", "call-2", '{"cell_id": "1"}')
            assert second.status == "completed"
            assert second.text.endswith("fahrenheit 66.2")
            failing = await code_mode.exec("call-3", source)
            assert failing.text.splitlines()[-2:] == [
                "tool broken failed: the service is down",
                "not today",
            ]
            with pytest.raises(ValueError, match="no tool named 'run'"):
                await code_mode.call("run", "call-4", "")

    run_on_asyncio(main)


@pytest.mark.parametrize("kind", PROVIDERS)
def test_cancelling_the_asyncio_task_terminates_the_cell_and_cancels_its_tool(kind: str) -> None:
    app = Application()

    async def main() -> None:
        async with opened(kind) as provider:
            session = await provider.create_session()
            code_mode = aio.CodeMode(session, _ClosedCells(app), app.tools)
            task = asyncio.create_task(
                code_mode.exec("call-1", 'text(await tools.slow({ label: "first" }))')
            )
            await app.started.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # Released before the CancelledError arrived, as on trio: the tool saw its
            # cancellation, the cell closed.
            assert app.cancelled == ["first"]
            assert app.closed == ["1"]
            assert await session.cells() == []
            # The same through asyncio.timeout, on a wait this time.
            app.started.clear()
            running = await code_mode.exec(
                "call-2",
                '// @exec: {"yield_time_ms": 0}\ntext(await tools.slow({ label: "second" }))',
            )
            assert running.status == "running"
            await app.started.wait()
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.05):
                    await code_mode.wait({"cell_id": "2", "yield_time_ms": LONG_MS})
            assert app.cancelled == ["first"]  # a cancelled wait leaves the cell running
            app.release.set()
            done = await code_mode.wait({"cell_id": "2", "yield_time_ms": LONG_MS})
            assert (done.status, done.text.splitlines()[-1]) == ("completed", "second")

    run_on_asyncio(main)


class _ClosedCells:
    """The application's toolbox, recording `cell_closed`."""

    def __init__(self, app: Application) -> None:
        self._app = app

    async def invoke_tool(self, call: codemode.NestedToolCall) -> codemode.JsonValue:
        return await self._app.toolbox.invoke_tool(call)

    async def notify(self, call_id: str, cell_id: str, text: str) -> None:
        await self._app.toolbox.notify(call_id, cell_id, text)

    def cell_closed(self, cell_id: str) -> None:
        self._app.closed.append(cell_id)


def test_a_cancelled_provider_block_shuts_its_sessions_down() -> None:
    app = Application()
    closed = asyncio.Event()

    async def main() -> None:
        async with aio.open_in_process_provider() as provider:
            session = await provider.create_session()
            started = await session.execute(
                ExecuteRequest(
                    tool_call_id="call-1",
                    source='await tools.slow({ label: "held" })',
                    enabled_tools=app.tools,
                ),
                _ClosedCells(app),
            )
            started.release()
            await app.started.wait()
            closed.set()
            await asyncio.Event().wait()  # until cancelled

    async def cancelled() -> None:
        task = asyncio.create_task(main())
        await closed.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run_on_asyncio(cancelled)
    assert app.cancelled == ["held"]
    assert app.closed == ["1"]


def test_one_guest_run_per_loop_started_and_ended_with_its_providers() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        async with aio.open_in_process_provider() as first, aio.open_in_process_provider() as b:
            assert first._bridge is b._bridge
            assert trio.lowlevel.in_trio_run()
        assert not trio.lowlevel.in_trio_run()
        async with open_bridge() as bridge:
            assert bridge.loop is loop
            assert await bridge.call(_plus_one, 41) == 42

    run_on_asyncio(main)


async def _plus_one(value: int) -> int:
    await trio.lowlevel.checkpoint()
    return value + 1


def test_a_result_its_cancelled_caller_never_saw_goes_to_the_orphan_handler() -> None:
    orphans: list[int] = []

    async def main() -> None:
        async with open_bridge() as bridge:
            loop = asyncio.get_running_loop()
            task: asyncio.Task[int] | None = None

            async def finish_as_the_caller_is_cancelled() -> int:
                assert task is not None
                loop.call_soon(task.cancel)  # runs after the result is set, before the caller
                return 7

            def orphan(value: int) -> None:
                orphans.append(value)

            task = asyncio.create_task(
                bridge.call(finish_as_the_caller_is_cancelled, orphan=orphan)
            )
            with pytest.raises(asyncio.CancelledError):
                await task

    run_on_asyncio(main)
    assert orphans == [7]


class _CancelCaller:
    """A trio session that, as its `execute` or `wait` returns, has the asyncio task that
    awaits it cancelled: the result is ready but its caller never sees it."""

    def __init__(self, session: codemode.Session, loop: asyncio.AbstractEventLoop) -> None:
        self._session = session
        self._loop = loop
        self.victim: asyncio.Task[Any] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    def _cancel_victim(self) -> None:
        assert self.victim is not None
        self._loop.call_soon(self.victim.cancel)
        self.victim = None

    async def execute(
        self,
        request: ExecuteRequest,
        delegate: codemode.SessionDelegate,
        *,
        observe_initial: bool = True,
        idempotency_key: str | None = None,
    ) -> codemode.StartedCell:
        started = await self._session.execute(
            request, delegate, observe_initial=observe_initial, idempotency_key=idempotency_key
        )
        if self.victim is not None:
            self._cancel_victim()
        return started

    async def wait(
        self, request: WaitRequest, *, idempotency_key: str | None = None
    ) -> codemode.WaitOutcome:
        outcome = await self._session.wait(request, idempotency_key=idempotency_key)
        if self.victim is not None:
            self._cancel_victim()
        return outcome


def test_late_cancellations_terminate_unseen_cells_and_keep_unseen_output() -> None:
    app = Application()

    async def main() -> None:
        async with aio.open_in_process_provider() as provider:
            session = await provider.create_session()
            cancelling = _CancelCaller(session.trio_session, asyncio.get_running_loop())
            session.trio_session = cancelling
            request = ExecuteRequest(
                tool_call_id="call-1",
                source='text("before"); yield_control(); await tools.slow({ label: "x" }); text("after")',
                enabled_tools=app.tools,
                yield_time_ms=LONG_MS,
            )
            # An execute whose cell id never reached its caller: the cell is terminated.
            task = asyncio.create_task(session.execute(request, _ClosedCells(app)))
            cancelling.victim = task
            with pytest.raises(asyncio.CancelledError):
                await task
            assert app.closed == ["1"]
            missing = await session.wait(WaitRequest(cell_id="1"))
            assert isinstance(missing, MissingCell)
            # A wait whose output never reached its caller: the next wait has it.
            started = await session.execute(msgspec_replace(request, "call-2"), app.toolbox)
            started.release()
            waiting = asyncio.create_task(session.wait(WaitRequest(cell_id="2")))
            cancelling.victim = waiting
            with pytest.raises(asyncio.CancelledError):
                await waiting
            kept = await session.wait(WaitRequest(cell_id="2"))
            assert isinstance(kept, LiveCell)
            assert isinstance(kept.response, Yielded)
            assert texts(kept.response) == ["before"]
            app.release.set()
            rest = await session.wait(WaitRequest(cell_id="2"))
            assert isinstance(rest.response, Completed)
            assert texts(rest.response) == ["after"]

    run_on_asyncio(main)


def msgspec_replace(request: ExecuteRequest, call_id: str) -> ExecuteRequest:
    import msgspec

    return msgspec.structs.replace(request, tool_call_id=call_id)


def test_a_sync_on_notify_runs_in_a_thread_and_an_async_one_on_the_loop() -> None:
    seen: list[tuple[str, bool]] = []

    def plain(cell_id: str, text: str) -> None:
        seen.append((text, threading.current_thread() is threading.main_thread()))

    async def coroutine(cell_id: str, text: str) -> None:
        seen.append((text, asyncio.current_task() is not None))

    async def main() -> None:
        async with aio.open_in_process_provider() as provider:
            session = await provider.create_session()
            for index, handler in enumerate([plain, coroutine]):
                toolbox = codemode.Toolbox(on_notify=handler)
                started = await session.execute(
                    ExecuteRequest(tool_call_id=f"call-{index}", source=f'notify("n{index}")'),
                    toolbox,
                )
                assert isinstance(await started.initial_response(), Completed)

    run_on_asyncio(main)
    assert seen == [("n0", False), ("n1", True)]


def test_limits_and_errors_are_the_trio_providers() -> None:
    async def main() -> None:
        async with aio.open_in_process_provider() as provider:
            session = await provider.create_session(CellLimits(max_heap_size_bytes=8 << 20))
            outcome = await session.terminate("9")
            assert isinstance(outcome, MissingCell)
            await session.shutdown()
            assert not session.is_alive
            with pytest.raises(codemode.SessionShuttingDownError):
                await session.execute(
                    ExecuteRequest(tool_call_id="call-1", source="1"), codemode.Toolbox()
                )

    run_on_asyncio(main)


# --- The session contract, as a third flavour -------------------------------------------------
#
# The contract tests are trio code (their delegates too). Here each runs as a task of the guest
# run, against a session that is the `codemode.aio.Session` seen back through asyncio: every
# operation goes trio -> asyncio task -> `codemode.aio` -> trio, and every tool call and
# notification the other way, so both directions of the bridge carry the whole contract, with
# its cancellations.


class _Crossings:
    """Tool calls on their way back to trio that the trio delegate has not begun yet. The
    frontier's promise (a `Pending` lists calls the delegate has seen) holds for the asyncio
    delegate `codemode.aio` is given; the trio delegate behind it sees a call one more hop
    later, so the flavour's frontier operations wait for these hops (on events) before they
    return, as a real asyncio delegate would have run by then."""

    def __init__(self) -> None:
        self.pending = 0
        self._changed = trio.Event()

    def arrived(self) -> None:
        self.pending -= 1
        self._changed.set()
        self._changed = trio.Event()

    async def settled(self) -> None:
        while self.pending:
            await self._changed.wait()


class _AsyncioFacing:
    """A trio delegate, offered to `codemode.aio` as an asyncio one (its calls cross back)."""

    def __init__(
        self,
        delegate: codemode.SessionDelegate,
        bridge: Bridge | _WatchedBridge,
        crossings: _Crossings | None = None,
    ) -> None:
        self._delegate = delegate
        self._bridge = bridge
        self._crossings = crossings or _Crossings()

    async def invoke_tool(self, call: codemode.NestedToolCall) -> codemode.JsonValue:
        crossings = self._crossings
        crossings.pending += 1  # on asyncio, in the guest run's thread: trio reads it later
        arrived = False

        async def begun(call: codemode.NestedToolCall) -> codemode.JsonValue:
            nonlocal arrived
            arrived = True
            crossings.arrived()
            return await self._delegate.invoke_tool(call)

        try:
            return await self._bridge.call(begun, call)
        finally:
            if not arrived:  # cancelled before it reached trio
                arrived = True
                self._bridge.soon(crossings.arrived)

    async def notify(self, call_id: str, cell_id: str, text: str) -> None:
        await self._bridge.call(self._delegate.notify, call_id, cell_id, text)

    def cell_closed(self, cell_id: str) -> None:
        self._delegate.cell_closed(cell_id)


class _TrioFacingSession:
    """A `codemode.aio.Session`, seen from trio through asyncio tasks."""

    def __init__(self, session: aio.Session, bridge: Bridge | _WatchedBridge) -> None:
        self._session = session
        self._bridge = bridge
        self._crossings = _Crossings()

    @property
    def is_alive(self) -> bool:
        return self._session.is_alive

    async def _on_asyncio(self, function: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        async def run() -> Any:
            return await function(*args)

        return await self._bridge.run_asyncio(run)

    async def execute(
        self,
        request: ExecuteRequest,
        delegate: codemode.SessionDelegate,
        *,
        observe_initial: bool = True,
        idempotency_key: str | None = None,
    ) -> codemode.StartedCell:
        started: aio.StartedCell = await self._on_asyncio(
            partial(
                self._session.execute,
                observe_initial=observe_initial,
                idempotency_key=idempotency_key,
            ),
            request,
            _AsyncioFacing(delegate, self._bridge, self._crossings),
        )

        async def initial_response() -> codemode.RuntimeResponse:
            response: codemode.RuntimeResponse = await self._on_asyncio(started.initial_response)
            return response

        # Named after the trio session's id, as the warning of a dropped cell names it.
        return codemode.StartedCell._create(
            started.cell_id,
            initial_response,
            started.release,
            session_id=started._started._session_id,
            observe_initial=observe_initial,
        )

    async def wait(
        self, request: WaitRequest, *, idempotency_key: str | None = None
    ) -> codemode.WaitOutcome:
        outcome: codemode.WaitOutcome = await self._on_asyncio(
            partial(self._session.wait, idempotency_key=idempotency_key), request
        )
        return outcome

    async def terminate(
        self, cell_id: str, *, idempotency_key: str | None = None
    ) -> codemode.WaitOutcome:
        outcome: codemode.WaitOutcome = await self._on_asyncio(
            partial(self._session.terminate, idempotency_key=idempotency_key), cell_id
        )
        return outcome

    async def shutdown(self) -> None:
        await self._on_asyncio(self._session.shutdown)

    async def execute_to_pending(
        self,
        request: ExecuteRequest,
        delegate: codemode.SessionDelegate,
        *,
        idempotency_key: str | None = None,
    ) -> codemode.Pending | Completed | Terminated:
        response: codemode.Pending | Completed | Terminated = await self._on_asyncio(
            partial(self._session.execute_to_pending, idempotency_key=idempotency_key),
            request,
            _AsyncioFacing(delegate, self._bridge, self._crossings),
        )
        await self._crossings.settled()
        return response

    async def wait_to_pending(
        self, cell_id: str, *, idempotency_key: str | None = None
    ) -> codemode.WaitOutcome:
        outcome: codemode.WaitOutcome = await self._on_asyncio(
            partial(self._session.wait_to_pending, idempotency_key=idempotency_key), cell_id
        )
        await self._crossings.settled()
        return outcome

    async def preempt(self, cell_id: str) -> None:
        await self._on_asyncio(self._session.preempt, cell_id)

    async def cells(self) -> list[codemode.CellInfo]:
        cells: list[codemode.CellInfo] = await self._on_asyncio(self._session.cells)
        return cells

    async def usage(self) -> codemode.SessionUsage:
        usage: codemode.SessionUsage = await self._on_asyncio(self._session.usage)
        return usage


_TRACKED: contextvars.ContextVar[bool] = contextvars.ContextVar("_TRACKED", default=False)
"""Set in the asyncio tasks that `_WatchedBridge.run_asyncio` starts."""


class _WatchedBridge:
    """The provider's bridge, counting the asyncio tasks it runs for trio while they run on
    asyncio: from their start to their end, but for the time each waits for a trio call of its
    own (`call`), which trio sees. With none running and every trio task blocked, an operation
    of the session is blocked waiting, as `trio.testing.wait_all_tasks_blocked` means under
    trio (`settle`, the flavour's `tests.sessions.SETTLE`). Every count changes in trio, at the
    hand-overs; each change sets an event, so `settle` waits on events, never on time."""

    def __init__(self, bridge: Bridge) -> None:
        self._bridge = bridge
        self._on_asyncio = 0
        self._changed = trio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bridge, name)

    def _count(self, change: int) -> None:
        self._on_asyncio += change
        self._changed.set()
        self._changed = trio.Event()

    async def run_asyncio(
        self, function: Callable[..., Coroutine[Any, Any, Any]], *args: Any
    ) -> Any:
        async def tracked(*args: Any) -> Any:
            _TRACKED.set(True)
            return await function(*args)

        self._count(1)
        try:
            return await self._bridge.run_asyncio(tracked, *args)
        finally:
            self._count(-1)

    async def call(
        self, function: Callable[..., Awaitable[Any]], *args: Any, orphan: Any = None
    ) -> Any:
        if not _TRACKED.get():
            return await self._bridge.call(function, *args, orphan=orphan)

        async def counted(*args: Any) -> Any:
            self._count(-1)  # in trio, where its caller waits for it
            try:
                return await function(*args)
            finally:
                self._count(1)  # back to its caller, on asyncio

        return await self._bridge.call(counted, *args, orphan=orphan)

    async def settle(self) -> None:
        while True:
            while self._on_asyncio:
                await self._changed.wait()
            await trio.testing.wait_all_tasks_blocked()
            if not self._on_asyncio:
                return


class _TrioFacingProvider:
    def __init__(self, provider: aio.Provider, bridge: _WatchedBridge, *, timed: bool) -> None:
        self._provider = provider
        self._bridge = bridge
        self._timed = timed

    async def create_session(
        self, limits: CellLimits | None = None, *, store_load: bool = True
    ) -> codemode.Session:
        async def create() -> aio.Session:
            return await self._provider.create_session(limits, store_load=store_load)

        session = await self._bridge.run_asyncio(create)
        from tests.conftest import _DurationCheckedSession

        facing = _TrioFacingSession(session, self._bridge)
        return _DurationCheckedSession(facing, timed=self._timed)


FIXTURES = {"session", "delegate", "provider"}
"""The fixtures of the contract tests that the asyncio flavour gives them."""


def _contract() -> list[Any]:
    """The contract tests that take only a session, a delegate or a provider, and the values of
    their own parameters where they are parametrised (one row per value, named as pytest names
    it). Left out: those for one provider only (parametrised over `provider` themselves), those
    needing an engine or other fixtures. Those that wait for every task to be blocked do it
    through `tests.sessions.all_tasks_blocked`, which here also waits for the operations'
    asyncio tasks (`_WatchedBridge.settle`): trio alone does not see them."""
    import inspect

    from tests import (
        test_idempotency,
        test_model_code_mode,
        test_pending_frontier,
        test_runtime_cells,
        test_runtime_end_to_end,
    )

    chosen = []
    for module in (
        test_idempotency,
        test_runtime_end_to_end,
        test_runtime_cells,
        test_pending_frontier,
        test_model_code_mode,
    ):
        for name, function in vars(module).items():
            if not name.startswith("test_") or not inspect.iscoroutinefunction(function):
                continue
            rows = _rows(getattr(function, "pytestmark", []))
            if rows is None:
                continue
            parameters = set(inspect.signature(function).parameters)
            for suffix, values in rows:
                if parameters - set(values) and parameters - set(values) <= FIXTURES:
                    chosen.append(pytest.param(function, values, id=name + suffix))
    return chosen


def _rows(marks: list[pytest.Mark]) -> list[tuple[str, dict[str, Any]]] | None:
    """The rows of a test's own `parametrize` marks (one, unparametrised, without marks), or
    None for a test with other marks (slow, for one provider, ...)."""
    rows: list[tuple[str, dict[str, Any]]] = [("", {})]
    for mark in marks:
        if mark.name != "parametrize" or "indirect" in mark.kwargs:
            return None
        names, values = mark.args
        names = [name.strip() for name in names.split(",")] if isinstance(names, str) else names
        ids = mark.kwargs.get("ids")
        if len(names) == 1:
            values = [(value,) for value in values]
        labels = ids or [str(index) for index in range(len(values))]
        rows = [
            (f"{suffix}[{label}]", {**row, **dict(zip(names, value, strict=True))})
            for suffix, row in rows
            for label, value in zip(labels, values, strict=True)
        ]
    return rows


CONTRACT_PROVIDERS = [
    "in-process",
    pytest.param("process", marks=pytest.mark.slow),
    pytest.param("remote", marks=pytest.mark.slow),
]
"""The rows of the asyncio flavour: the trio flavour's (tests/conftest.py `PROVIDERS`) but the
pool, whose sessions are process sessions on one of two hosts (its own tests cover the routing):
in-process, a host spawned for the test, and a connection of the test's own to the session's
shared listening host (`shared_host`)."""


@pytest.mark.parametrize(("test", "values"), _contract())
@pytest.mark.parametrize("kind", CONTRACT_PROVIDERS)
def test_the_contract(
    kind: str,
    test: Callable[..., Awaitable[None]],
    values: dict[str, Any],
    request: pytest.FixtureRequest,
) -> None:
    import inspect

    from tests.delegates import RecordingDelegate

    remote_address = ""
    shared_host: SharedHost | None = None
    if kind == "remote":
        shared_host = request.getfixturevalue("shared_host")
        remote_address = shared_host.address()

    async def main() -> None:
        async with opened(kind, remote_address) as provider:
            bridge = provider._bridge
            watched = _WatchedBridge(bridge)
            provider._bridge = watched  # type: ignore[assignment]  # its sessions' bridge too
            facing = _TrioFacingProvider(provider, watched, timed=kind != "in-process")
            arguments: dict[str, Any] = dict(values)

            async def in_trio() -> None:
                SETTLE.set(watched.settle)
                for name in inspect.signature(test).parameters:
                    if name in arguments:
                        continue
                    if name == "session":
                        arguments[name] = await facing.create_session()
                    elif name == "delegate":
                        arguments[name] = RecordingDelegate()
                    else:
                        arguments[name] = facing
                with trio.fail_after(60):
                    await test(**arguments)

            await bridge.call(in_trio)

    run_on_asyncio(main, seconds=90)
    if shared_host is not None:
        shared_host.check()


def test_the_callers_context_does_not_reach_the_delegate_calls() -> None:
    marker: contextvars.ContextVar[str] = contextvars.ContextVar("marker", default="unset")
    seen: list[str] = []
    toolbox = codemode.Toolbox()

    @toolbox.tool
    async def look() -> None:
        """Reads the marker."""
        seen.append(marker.get())

    async def main() -> None:
        async with aio.open_in_process_provider() as provider:
            marker.set("the caller's")
            session = await provider.create_session()
            started = await session.execute(
                ExecuteRequest(
                    tool_call_id="call-1",
                    source="await tools.look()",
                    enabled_tools=toolbox.definitions(),
                ),
                toolbox,
            )
            assert isinstance(await started.initial_response(), Completed)

    run_on_asyncio(main)
    # As on trio: a call runs in a copy of the provider's context, not in its caller's.
    assert seen == ["unset"]


@pytest.mark.slow
def test_the_documented_example_runs() -> None:
    import re
    import subprocess
    import sys

    from tests.typecheck import ROOT

    text = (ROOT / "docs" / "integrations.md").read_text()
    match = re.search(r"## asyncio applications.*?```python\n(.*?)```", text, re.DOTALL)
    assert match is not None
    result = subprocess.run(
        [sys.executable, "-c", match.group(1)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.startswith("Script completed\n")
    assert result.stdout.endswith("Output:\n\n19\n")


def test_code_mode_asks_an_asyncio_approver_and_never_runs_a_marked_tool_unattended() -> None:
    toolbox = codemode.Toolbox()
    sent: list[str] = []

    @toolbox.tool(needs_approval=True)
    async def send_mail(to: str) -> str:
        """Sends a mail."""
        sent.append(to)
        return f"sent to {to}"

    asked: list[tuple[str, bool]] = []

    async def approver(request: codemode.ApprovalRequest) -> codemode.Approve | codemode.Deny:
        asked.append((request.identifier, sniffio.current_async_library() == "asyncio"))
        await asyncio.sleep(0)  # an asyncio coroutine, run on the loop
        return codemode.Approve() if request.arguments["to"] == "ok" else codemode.Deny("no")

    source = (
        "for (const to of ['ok', 'nope']) {"
        " try { text(await tools.send_mail({ to })) } catch (e) { text(e.message) } }"
    )

    async def run(code_mode: aio.CodeMode) -> str:
        output = await code_mode.exec("c", source)
        texts = [output.text]
        while output.status == "running":
            output = await code_mode.wait({"cell_id": output.cell_id})
            texts.append(output.text)
        return "\n".join(texts)

    results: list[str] = []

    async def main() -> None:
        async with aio.open_in_process_provider() as provider:
            unattended = aio.CodeMode(
                await provider.create_session(), toolbox, toolbox.definitions()
            )
            results.append(await run(unattended))
            asking = aio.CodeMode(
                await provider.create_session(), toolbox, toolbox.definitions(), approver=approver
            )
            results.append(await run(asking))

    run_on_asyncio(main)
    denied = "tool tools.send_mail was denied: it needs approval and no approver is configured"
    assert results[0].splitlines()[-2:] == [denied, denied]
    lines = results[1].splitlines()
    assert "sent to ok" in lines
    assert lines[-1] == "tool tools.send_mail was denied: no"
    assert asked == [("send_mail", True), ("send_mail", True)]
    assert sent == ["ok"]
