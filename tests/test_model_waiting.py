"""Cheaper waiting: `min_yield_time_ms` and `max_empty_wait_ms` (off by default)."""

from __future__ import annotations

from typing import Any

import trio

from codemode import (
    CellInfo,
    CodeMode,
    Completed,
    ExecuteRequest,
    JsonValue,
    NestedToolCall,
    Pending,
    Session,
    SessionDelegate,
    SessionUsage,
    StartedCell,
    Terminated,
    WaitOutcome,
    WaitRequest,
)
from tests.conftest import Provider
from tests.delegates import RecordingDelegate
from tests.sessions import tool


class ObservedSession:
    """Passes every call to a real session and records the observation windows asked for."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self.executed: list[int | None] = []
        self.waited: list[int] = []
        self.answered = 0
        self._changed = trio.Event()

    async def until_answered(self, count: int) -> None:
        while self.answered < count:
            await self._changed.wait()

    @property
    def is_alive(self) -> bool:
        return self._session.is_alive

    async def execute(
        self,
        request: ExecuteRequest,
        delegate: SessionDelegate,
        *,
        observe_initial: bool = True,
        idempotency_key: str | None = None,
    ) -> StartedCell:
        self.executed.append(request.yield_time_ms)
        return await self._session.execute(
            request, delegate, observe_initial=observe_initial, idempotency_key=idempotency_key
        )

    async def wait(
        self, request: WaitRequest, *, idempotency_key: str | None = None
    ) -> WaitOutcome:
        self.waited.append(request.yield_time_ms)
        outcome = await self._session.wait(request, idempotency_key=idempotency_key)
        self.answered += 1
        self._changed.set()
        self._changed = trio.Event()
        return outcome

    async def execute_to_pending(
        self,
        request: ExecuteRequest,
        delegate: SessionDelegate,
        *,
        idempotency_key: str | None = None,
    ) -> Pending | Completed | Terminated:
        return await self._session.execute_to_pending(
            request, delegate, idempotency_key=idempotency_key
        )

    async def wait_to_pending(
        self, cell_id: str, *, idempotency_key: str | None = None
    ) -> WaitOutcome:
        return await self._session.wait_to_pending(cell_id, idempotency_key=idempotency_key)

    async def preempt(self, cell_id: str) -> None:
        await self._session.preempt(cell_id)

    async def terminate(self, cell_id: str, *, idempotency_key: str | None = None) -> WaitOutcome:
        return await self._session.terminate(cell_id, idempotency_key=idempotency_key)

    async def shutdown(self) -> None:
        await self._session.shutdown()

    async def cells(self) -> list[CellInfo]:
        return await self._session.cells()

    async def usage(self) -> SessionUsage:
        return await self._session.usage()


class Gate:
    def __init__(self) -> None:
        self.open = trio.Event()

    async def behaviour(self, call: NestedToolCall) -> JsonValue:
        await self.open.wait()
        return {}


async def open_code_mode(
    provider: Provider, gate: Gate, **options: Any
) -> tuple[CodeMode, ObservedSession, RecordingDelegate]:
    session = ObservedSession(await provider.create_session())
    delegate = RecordingDelegate(on_tool=gate.behaviour)
    return CodeMode(session, delegate, [tool("gate")], **options), session, delegate


LATE_OUTPUT = "await tools.gate({}); text('late'); yield_control(); await new Promise(() => {})"
# Nothing tells the test when the host has attached a wait, and a `yield_control()` with no
# observer attached is ignored (design.md, runtime 3.9): this cell yields every millisecond after
# its late output, so the wait sees it however the wait and the tool's answer race.
LATE_OUTPUT_YIELDING = (
    "await tools.gate({}); text('late');"
    " for (;;) { yield_control(); await new Promise((resolve) => setTimeout(resolve, 1)); }"
)


async def test_windows_are_the_models_by_default(provider: Provider) -> None:
    gate = Gate()
    code_mode, session, _ = await open_code_mode(provider, gate)
    with trio.fail_after(10):
        first = await code_mode.exec("call-1", f'// @exec: {{"yield_time_ms": 0}}\n{LATE_OUTPUT}')
        empty = await code_mode.wait({"cell_id": "1", "yield_time_ms": 0})
        gate.open.set()
        await code_mode.wait({"cell_id": "1", "terminate": True})
        plain = await code_mode.exec("call-2", "text(1)")
    assert (first.status, len(first.items)) == ("running", 1)
    assert (empty.status, len(empty.items)) == ("running", 1)
    assert session.executed == [0, None]
    assert session.waited == [0]
    assert plain.status == "completed"


async def test_min_yield_time_raises_the_exec_window(provider: Provider) -> None:
    gate = Gate()
    code_mode, session, delegate = await open_code_mode(provider, gate, min_yield_time_ms=60_000)
    outputs = []

    async def run() -> None:
        outputs.append(
            await code_mode.exec(
                "call-1", '// @exec: {"yield_time_ms": 0}\nawait tools.gate({}); text("done")'
            )
        )

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            await delegate.until(lambda: len(delegate.invocations) == 1)
            gate.open.set()
        unset = await code_mode.exec("call-2", "text(2)")
    # The model's 0 ms window became 60 s, so the exec saw the cell complete.
    [output] = outputs
    assert (output.status, output.text.splitlines()[-1]) == ("completed", "done")
    assert session.executed == [60_000, 60_000]
    assert unset.status == "completed"


async def test_min_yield_time_raises_the_wait_window_and_keeps_longer_ones(
    provider: Provider,
) -> None:
    gate = Gate()
    code_mode, session, delegate = await open_code_mode(provider, gate, min_yield_time_ms=30_000)
    outputs = []

    async def wait() -> None:
        outputs.append(await code_mode.wait({"cell_id": "1", "yield_time_ms": 5}))

    with trio.fail_after(10):
        await code_mode.exec("call-1", f"yield_control(); {LATE_OUTPUT_YIELDING}")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait)
            await delegate.until(lambda: len(delegate.invocations) == 1)
            gate.open.set()
        longer = await code_mode.wait({"cell_id": "1", "yield_time_ms": 0, "terminate": True})
    assert [output.text.splitlines()[-1] for output in outputs] == ["late"]
    assert session.executed == [30_000]
    assert session.waited == [30_000]
    assert longer.status == "terminated"
    floor_zero, zero_session, _ = await open_code_mode(provider, Gate(), min_yield_time_ms=0)
    with trio.fail_after(10):
        await floor_zero.exec("call-1", '// @exec: {"yield_time_ms": 20000}\ntext(1)')
    assert zero_session.executed == [20_000]


async def test_max_empty_wait_keeps_observing_until_output_arrives(provider: Provider) -> None:
    gate = Gate()
    code_mode, session, _ = await open_code_mode(provider, gate, max_empty_wait_ms=60_000)
    outputs = []

    async def wait() -> None:
        outputs.append(await code_mode.wait({"cell_id": "1", "yield_time_ms": 0}))

    with trio.fail_after(10):
        first = await code_mode.exec("call-1", f"yield_control(); {LATE_OUTPUT}")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait)
            # The cell is blocked in its tool call, so this first window was empty.
            await session.until_answered(1)
            gate.open.set()
        await code_mode.wait({"cell_id": "1", "terminate": True})
    assert first.status == "running"
    [output] = outputs
    assert (output.status, output.text.splitlines()[-1]) == ("running", "late")
    assert session.waited[0] == 0
    assert 0 < session.waited[1] <= 1_000  # later windows: the model's, at least 1 s


async def test_max_empty_wait_gives_up_at_its_bound(provider: Provider) -> None:
    code_mode, session, _ = await open_code_mode(provider, Gate(), max_empty_wait_ms=300)
    with trio.fail_after(10):
        await code_mode.exec("call-1", f"yield_control(); {LATE_OUTPUT}")
        started = trio.current_time()
        empty = await code_mode.wait({"cell_id": "1", "yield_time_ms": 0})
        waited = trio.current_time() - started
        await code_mode.wait({"cell_id": "1", "terminate": True})
    assert (empty.status, len(empty.items)) == ("running", 1)
    assert waited >= 0.3
    assert session.waited[0] == 0
    assert all(0 < window <= 300 for window in session.waited[1:])
    assert len(session.waited) >= 2


async def test_max_empty_wait_returns_a_completion_at_once(provider: Provider) -> None:
    gate = Gate()
    code_mode, session, _ = await open_code_mode(provider, gate, max_empty_wait_ms=60_000)
    outputs = []

    async def wait() -> None:
        outputs.append(await code_mode.wait({"cell_id": "1", "yield_time_ms": 0}))

    with trio.fail_after(10):
        await code_mode.exec("call-1", "yield_control(); await tools.gate({})")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait)
            await session.until_answered(1)
            gate.open.set()
    [output] = outputs
    assert (output.status, len(output.items)) == ("completed", 1)
    assert len(session.waited) == 2
