"""Which cells have a task of their own (rule 10 of `runtime/_cell.py`): none while the
JavaScript runs or waits, none for a completion nobody collected; one for a drain and one for a
termination. And the watch over task-less cells (`runtime/_watch.py`): a session's own, which
its shutdown ends, and one shared by sessions, which their nursery's cancellation ends."""

from __future__ import annotations

import gc

import trio
import trio.testing
from codemode_host.engine import Engine
from codemode_host.runtime import CellWatch, RuntimeSession
from codemode_host.runtime._cell import RuntimeCell
from codemode_host.runtime._phases import Lifecycle

from codemode import CellLimits, Completed, InputText, LiveCell, Terminated
from codemode._trio import CallWorkers
from tests.delegates import RecordingDelegate
from tests.test_pending_frontier import holding, request

WAITING = "await new Promise(() => {});"


async def until_completed(cell: RuntimeCell) -> None:
    # The engine reports on its own thread: poll the cell's state, a pass at a time.
    while cell.lifecycle is not Lifecycle.COMPLETED:
        await trio.lowlevel.checkpoint()


async def test_waiting_and_calling_cells_have_no_task_of_their_own(engine: Engine) -> None:
    delegate = holding()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            runtime = RuntimeSession(engine, nursery, CellLimits())
            sources = [WAITING] * 10 + ['await tools.echo({}); text("answered")']
            cells = [runtime.start(request(source), delegate) for source in sources]
            for cell in cells:
                cell.release_initial_observer()
            await delegate.until(lambda: len(delegate.invocations) == 1)
            await trio.testing.wait_all_tasks_blocked()
            # The session's watch and the worker running the tool call: nothing per cell.
            assert len(nursery.child_tasks) == 2
            assert not any(cell._has_task for cell in cells)
            delegate.release.set()
            await until_completed(cells[-1])
            assert not cells[-1]._has_task
            await runtime.shutdown()
    assert sorted(delegate.closed, key=int) == [str(n) for n in range(1, 12)]
    assert delegate.cancelled_tools == []


async def test_a_terminate_closes_a_completed_cell_without_a_task(engine: Engine) -> None:
    delegate = RecordingDelegate()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            runtime = RuntimeSession(engine, nursery, CellLimits())
            cell = runtime.start(request('text("done")'), delegate)
            cell.release_initial_observer()
            await until_completed(cell)
            outcome = await runtime.terminate(cell.cell_id)
            assert delegate.closed == ["1"]
            assert runtime.cell(cell.cell_id) is None
            assert not cell._has_task
            await runtime.shutdown()
    assert outcome == LiveCell(
        response=Completed(cell_id="1", content_items=[InputText(text="done")])
    )


async def test_a_termination_gives_the_cell_a_task_that_ends_with_it(engine: Engine) -> None:
    delegate = RecordingDelegate()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            runtime = RuntimeSession(engine, nursery, CellLimits())
            cell = runtime.start(request('text("one"); ' + WAITING), delegate)
            cell.release_initial_observer()
            await trio.testing.wait_all_tasks_blocked()
            outcome = await runtime.terminate(cell.cell_id)
            assert cell._has_task
            await trio.testing.wait_all_tasks_blocked()
            assert len(nursery.child_tasks) == 1  # the watch: the cell's task has ended
            await runtime.shutdown()
    assert isinstance(outcome, LiveCell)
    assert isinstance(outcome.response, Terminated)
    assert delegate.closed == ["1"]


async def test_a_cell_draining_a_notification_gets_a_task_and_completes_after_it(
    engine: Engine,
) -> None:
    delegate = RecordingDelegate()
    delegate.hold_notifications = True
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            runtime = RuntimeSession(engine, nursery, CellLimits())
            cell = runtime.start(request('notify("held"); text("done")'), delegate)
            await delegate.until(lambda: len(delegate.notifications) == 1)
            while cell.lifecycle is Lifecycle.RUNNING:
                await trio.lowlevel.checkpoint()
            assert cell.lifecycle is Lifecycle.DRAINING
            assert cell._has_task
            delegate.release.set()
            response = await cell.initial_response()
            await runtime.shutdown()
    assert response == Completed(cell_id="1", content_items=[InputText(text="done")])
    assert delegate.closed == ["1"]


async def test_a_shutdown_before_the_watch_task_runs_ends_it(engine: Engine) -> None:
    delegate = RecordingDelegate()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            runtime = RuntimeSession(engine, nursery, CellLimits())
            runtime.start(request('text("soon")'), delegate).release_initial_observer()
            await runtime.shutdown()  # the watch has not run yet: the nursery still ends
    assert delegate.closed == ["1"]


async def test_sessions_sharing_a_watch_have_one_watcher_which_closes_all_on_an_abort(
    engine: Engine,
) -> None:
    delegate = RecordingDelegate()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            watch = CellWatch(nursery)
            runtimes = [
                RuntimeSession(engine, nursery, CellLimits(), watch=watch) for _ in range(3)
            ]
            cells = [runtime.start(request(WAITING), delegate) for runtime in runtimes]
            for cell in cells:
                cell.release_initial_observer()
            await trio.testing.wait_all_tasks_blocked()
            assert len(nursery.child_tasks) == 1  # one watcher for the three sessions
            nursery.cancel_scope.cancel()
    assert delegate.closed == ["1", "1", "1"]  # each session's first cell
    assert all(runtime.cell("1") is None for runtime in runtimes)


async def test_a_shared_watch_forgets_closed_cells(engine: Engine) -> None:
    delegate = RecordingDelegate()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            watch = CellWatch(nursery)
            runtime = RuntimeSession(engine, nursery, CellLimits(), watch=watch)
            for _ in range(5):
                cell = runtime.start(request('text("done")'), delegate)
                await cell.initial_response()
            assert watch._cells == {}
            await runtime.shutdown()
            nursery.cancel_scope.cancel()  # the owner ends the shared watch
    assert delegate.closed == ["1", "2", "3", "4", "5"]


def _alive() -> list[object]:
    """The runtime sessions and cells the collector tracks: what a reference cycle keeps (gc's
    census, not weak references, which a compiled class takes none of: docs/compiled.md)."""
    return [o for o in gc.get_objects() if isinstance(o, RuntimeSession | RuntimeCell)]


async def test_a_shut_down_session_and_its_cells_need_no_cyclic_collection(engine: Engine) -> None:
    # The host tunes its collector to run rarely: a reference cycle through every session (a
    # bound method of the session in what its cells share) would keep them until it ran. The
    # sessions share their workers and watch, as the host's do: a session's own are closed by
    # cancelling their scopes, and the `Cancelled` trio hands their tasks keeps the frames of
    # whoever cancelled (the session's `shutdown`) until those tasks take it, a pass later.
    delegate = RecordingDelegate()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            workers, watch = CallWorkers(nursery, keep=4), CellWatch(nursery)
            gc.collect()
            gc.disable()
            try:
                runtime = RuntimeSession(
                    engine, nursery, CellLimits(), workers=workers, watch=watch
                )
                cell = runtime.start(request('text("done")'), delegate)
                assert isinstance(await cell.initial_response(), Completed)
                await runtime.shutdown()
                assert len(_alive()) == 2
                del runtime, cell
                assert _alive() == []
            finally:
                gc.enable()
                workers.close()
                watch.close()
