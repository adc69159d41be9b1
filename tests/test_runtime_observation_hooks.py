"""The runtime's observation machinery the host relies on, driven through `RuntimeSession`.

- Rule 7 of `runtime/_observer.py`: the host cancels an execute's initial observation through
  `RuntimeCell.initial.cancel`, without a trio cancel scope; the observation takes no
  output, and the next observer gets it.
- Rule 8 of `runtime/_observer.py`: the host starts an initial observation's task at its
  first wake; every way an observation ends wakes it, and output or a tool call do not.
- `RuntimeCell.initial_response_now`: the host takes a ready initial response without a task.
- Rule 9 of `runtime/_cell.py`: the observer's window end is an alarm of the engine; a window
  that ends while the JavaScript runs yields, and an alarm left by an observer that ended early
  only wakes the next observer, which goes on waiting.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing
from codemode_host.engine import Engine
from codemode_host.runtime import ObservationCancelledError, RuntimeSession
from codemode_host.runtime._cell import RuntimeCell
from codemode_host.runtime._phases import Lifecycle

from codemode import (
    CellLimits,
    Completed,
    InputText,
    LiveCell,
    Terminated,
    WaitRequest,
    Yielded,
)
from tests.delegates import RecordingDelegate
from tests.sessions import LONG_MS, texts
from tests.test_pending_frontier import holding, request


async def test_a_cancelled_initial_observation_takes_no_output(engine: Engine) -> None:
    delegate = holding()
    source = 'text("before"); await tools.echo({}); text("after")'
    async with trio.open_nursery() as nursery:
        runtime = RuntimeSession(engine, nursery, CellLimits())
        with trio.fail_after(10):
            cell = runtime.start(request(source), delegate)
            cancelled = trio.Event()

            async def observe() -> None:
                with pytest.raises(ObservationCancelledError):
                    await cell.initial_response()
                cancelled.set()

            nursery.start_soon(observe)
            # The observer sleeps with "before" buffered, the cell waiting for its tool.
            await delegate.until(lambda: len(delegate.invocations) == 1)
            await trio.testing.wait_all_tasks_blocked()
            cell.initial.cancel()
            await cancelled.wait()
            delegate.release.set()
            outcome = await runtime.wait(WaitRequest(cell_id="1", yield_time_ms=LONG_MS))
            await runtime.shutdown()
    assert outcome == LiveCell(
        response=Completed(
            cell_id="1", content_items=[InputText(text="before"), InputText(text="after")]
        )
    )


@pytest.mark.parametrize("taken", ["awaited", "now"])
async def test_an_initial_observation_cancelled_before_it_is_taken_leaves_the_completion(
    engine: Engine, taken: str
) -> None:
    # Taken by its await, or by `initial_response_now` (the host's, after the engine's batch).
    delegate = RecordingDelegate()
    async with trio.open_nursery() as nursery:
        runtime = RuntimeSession(engine, nursery, CellLimits())
        with trio.fail_after(10):
            cell = runtime.start(request('text("done")'), delegate)
            cell.initial.cancel()
            if taken == "awaited":
                with pytest.raises(ObservationCancelledError):
                    await cell.initial_response()
            else:
                with pytest.raises(ObservationCancelledError):
                    cell.initial_response_now()
            # Ended: a wait may observe the cell, and gets everything.
            outcome = await runtime.wait(WaitRequest(cell_id="1", yield_time_ms=LONG_MS))
            await runtime.shutdown()
    assert outcome == LiveCell(
        response=Completed(cell_id="1", content_items=[InputText(text="done")])
    )
    assert delegate.closed == ["1"]


async def test_a_window_ends_while_the_javascript_waits_and_a_stale_one_does_not_end_the_next(
    engine: Engine,
) -> None:
    delegate = holding()
    # The timer keeps the cell running well past the 50 ms window the preempted wait left.
    source = """
        text("a");
        await tools.echo({});
        await new Promise((resolve) => setTimeout(resolve, 300));
        text("b");
    """
    async with trio.open_nursery() as nursery:
        runtime = RuntimeSession(engine, nursery, CellLimits())
        with trio.fail_after(10):
            cell = runtime.start(request(source, yield_time_ms=20), delegate)
            first = await cell.initial_response()  # its window ends while the tool is held

            short: list[LiveCell] = []

            async def short_wait() -> None:
                outcome = await runtime.wait(WaitRequest(cell_id="1", yield_time_ms=50))
                assert isinstance(outcome, LiveCell)
                short.append(outcome)

            nursery.start_soon(short_wait)
            await trio.testing.wait_all_tasks_blocked()
            runtime.request_preempt("1")  # it yields at once; its 50 ms deadline stays behind
            await trio.testing.wait_all_tasks_blocked()
            delegate.release.set()
            # Its observer is woken at the stale deadline, finds its own window running, and
            # waits on: a yield here would be an empty `Yielded`.
            last = await runtime.wait(WaitRequest(cell_id="1", yield_time_ms=LONG_MS))
            await runtime.shutdown()
    assert first == Yielded(cell_id="1", content_items=[InputText(text="a")])
    assert short == [LiveCell(response=Yielded(cell_id="1", content_items=[]))]
    assert isinstance(last, LiveCell)
    assert isinstance(last.response, Completed)
    assert texts(last.response) == ["b"]


class WhenWoken:
    """Starts a cell's initial observation the way the host does: at its first wake (rule 8
    of `runtime/_observer.py`), recording what the observation answers."""

    def __init__(self, nursery: trio.Nursery, cell: RuntimeCell) -> None:
        self.starts = 0
        self.answers: list[object] = []
        self.answered = trio.Event()
        self._nursery = nursery
        self._cell = cell
        cell.initial.start_when_woken(self._start)

    def _start(self) -> None:
        self.starts += 1
        self._nursery.start_soon(self._observe)

    async def _observe(self) -> None:
        try:
            self.answers.append(await self._cell.initial_response())
        except ObservationCancelledError:
            self.answers.append("cancelled")
        self.answered.set()


async def test_an_initial_observation_started_at_its_first_wake_takes_the_completion(
    engine: Engine,
) -> None:
    delegate = holding()
    source = 'text("before"); await tools.echo({}); text("after")'
    async with trio.open_nursery() as nursery:
        runtime = RuntimeSession(engine, nursery, CellLimits())
        with trio.fail_after(10):
            cell = runtime.start(request(source), delegate)
            observation = WhenWoken(nursery, cell)
            await delegate.until(lambda: len(delegate.invocations) == 1)
            await trio.testing.wait_all_tasks_blocked()
            assert observation.starts == 0  # output and a tool call wake no one
            delegate.release.set()
            await observation.answered.wait()
            await runtime.shutdown()
    assert observation.answers == [
        Completed(cell_id="1", content_items=[InputText(text="before"), InputText(text="after")])
    ]
    assert observation.starts == 1


@pytest.mark.parametrize("ending", ["window", "cancel", "terminate", "shutdown"])
async def test_an_initial_observation_started_at_its_first_wake_answers_every_ending(
    engine: Engine, ending: str
) -> None:
    delegate = RecordingDelegate()
    window_ms = 20 if ending == "window" else LONG_MS
    async with trio.open_nursery() as nursery:
        runtime = RuntimeSession(engine, nursery, CellLimits())
        with trio.fail_after(10):
            source = 'text("waiting"); await new Promise(() => {})'
            cell = runtime.start(request(source, yield_time_ms=window_ms), delegate)
            observation = WhenWoken(nursery, cell)
            if ending == "cancel":
                cell.initial.cancel()
            elif ending == "terminate":
                nursery.start_soon(runtime.terminate, "1")
            elif ending == "shutdown":
                nursery.start_soon(runtime.shutdown)
            await observation.answered.wait()
            await runtime.shutdown()
    answer = observation.answers[0]
    assert observation.starts == 1
    if ending == "window":
        assert answer == Yielded(cell_id="1", content_items=[InputText(text="waiting")])
    elif ending == "cancel":
        assert answer == "cancelled"
    else:
        assert isinstance(answer, Terminated)
    assert delegate.closed == ["1"]


async def test_initial_response_now_takes_a_ready_completion_and_closes_the_cell(
    engine: Engine,
) -> None:
    # The host takes an initial response this way after the batch of events that woke it.
    delegate = holding()
    source = 'text("before"); await tools.echo({}); text("after")'
    async with trio.open_nursery() as nursery:
        runtime = RuntimeSession(engine, nursery, CellLimits())
        with trio.fail_after(10):
            cell = runtime.start(request(source), delegate)
            await delegate.until(lambda: len(delegate.invocations) == 1)
            assert cell.initial_response_now() is None  # running: nothing to answer yet
            delegate.release.set()
            while cell.lifecycle is not Lifecycle.COMPLETED:
                await trio.lowlevel.checkpoint()
            response = cell.initial_response_now()
            assert delegate.closed == ["1"]  # delivered: closed at once
            assert cell.initial_response_now() is None  # taken
            await runtime.shutdown()
    assert response == Completed(
        cell_id="1", content_items=[InputText(text="before"), InputText(text="after")]
    )


async def test_initial_response_now_leaves_a_frontier_observation_to_its_await(
    engine: Engine,
) -> None:
    delegate = RecordingDelegate()
    async with trio.open_nursery() as nursery:
        runtime = RuntimeSession(engine, nursery, CellLimits())
        with trio.fail_after(10):
            cell = runtime.start_to_pending(request('text("done")'), delegate)
            while cell.lifecycle is not Lifecycle.COMPLETED:
                await trio.lowlevel.checkpoint()
            assert cell.initial_response_now() is None
            response = await cell.initial_response()
            await runtime.shutdown()
    assert response == Completed(cell_id="1", content_items=[InputText(text="done")])
