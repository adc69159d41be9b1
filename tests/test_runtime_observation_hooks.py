"""The runtime's observation machinery the host relies on, driven through `RuntimeSession`.

- Rule 7 of `runtime/_observer.py`: the host cancels an execute's initial observation through
  `RuntimeCell.cancel_initial_response`, without a trio cancel scope; the observation takes no
  output, and the next observer gets it.
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

from codemode import CellLimits, Completed, InputText, LiveCell, WaitRequest, Yielded
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
            cell.cancel_initial_response()
            await cancelled.wait()
            delegate.release.set()
            outcome = await runtime.wait(WaitRequest(cell_id="1", yield_time_ms=LONG_MS))
            await runtime.shutdown()
    assert outcome == LiveCell(
        response=Completed(
            cell_id="1", content_items=[InputText(text="before"), InputText(text="after")]
        )
    )


async def test_an_initial_observation_cancelled_before_it_is_awaited_leaves_the_completion(
    engine: Engine,
) -> None:
    delegate = RecordingDelegate()
    async with trio.open_nursery() as nursery:
        runtime = RuntimeSession(engine, nursery, CellLimits())
        with trio.fail_after(10):
            cell = runtime.start(request('text("done")'), delegate)
            cell.cancel_initial_response()
            with pytest.raises(ObservationCancelledError):
                await cell.initial_response()
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
