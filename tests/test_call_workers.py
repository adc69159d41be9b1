"""`codemode._trio.CallbackGroup` and `CallWorkers`: delegate calls run by parked worker tasks,
or inline by the job that runs them (rules 1-7 of `codemode/_trio/_callbacks.py`)."""

from __future__ import annotations

import contextvars
import gc
import weakref

import pytest
import trio
import trio.testing

from codemode import Completed, JsonValue, LiveCell, NestedToolCall, WaitRequest, Yielded
from codemode._trio import CallbackGroup, CallWorkers
from codemode._trio._callbacks import FirstSuspension, Worker
from tests.delegates import RecordingDelegate
from tests.sessions import LONG_MS, run, texts, tool
from tests.test_wire_defects import PROVIDERS, session_of


class Held:
    """A delegate call that records its task and waits until released."""

    def __init__(self) -> None:
        self.release = trio.Event()
        self.tasks: list[trio.lowlevel.Task] = []
        self.cancelled = 0
        self.returned = 0

    async def __call__(self) -> None:
        self.tasks.append(trio.lowlevel.current_task())
        try:
            await self.release.wait()
        except trio.Cancelled:
            self.cancelled += 1
            raise
        self.returned += 1


async def test_sequential_calls_reuse_one_parked_worker() -> None:
    call = Held()
    call.release.set()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            workers = CallWorkers(nursery, keep=4)
            group = CallbackGroup(workers)
            for _ in range(3):
                group.start(call)
                await group.wait_idle()
                await trio.testing.wait_all_tasks_blocked()
                assert workers.parked == 1
            workers.close()  # the parked worker ends: the nursery can end by itself
    assert len(call.tasks) == 3
    assert len(set(call.tasks)) == 1


async def test_cancelling_one_call_leaves_the_others_and_retires_its_worker() -> None:
    first, second = Held(), Held()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            workers = CallWorkers(nursery, keep=4)
            group = CallbackGroup(workers)
            cancelled = group.start(first)
            group.start(second)
            await group.all_started()
            cancelled.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert (first.cancelled, second.cancelled) == (1, 0)
            assert not group.idle
            assert workers.parked == 0  # the cancelled call's worker ended
            second.release.set()
            await group.wait_idle()
            await trio.testing.wait_all_tasks_blocked()
            assert second.returned == 1
            assert workers.parked == 1
            cancelled.cancel()  # over: nothing happens to the parked worker
            third = Held()
            group.start(third)
            await group.all_started()
            assert third.tasks == second.tasks  # the same worker, not cancelled
            third.release.set()
            await group.wait_idle()
            assert third.returned == 1
            workers.close()


async def test_a_call_cancelled_before_it_begins_reaches_the_delegate_cancelled() -> None:
    held = Held()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            workers = CallWorkers(nursery, keep=4)
            group = CallbackGroup(workers)
            group.start(held).cancel()
            assert not group.all_running
            await group.wait_idle()
            workers.close()
    assert len(held.tasks) == 1  # it saw the call
    assert held.cancelled == 1


async def test_a_parked_worker_handed_a_cancelled_call_cancels_it_and_ends() -> None:
    warm, held = Held(), Held()
    warm.release.set()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            workers = CallWorkers(nursery, keep=4)
            group = CallbackGroup(workers)
            group.start(warm)
            await group.wait_idle()
            await trio.testing.wait_all_tasks_blocked()
            assert workers.parked == 1
            group.start(held).cancel()  # handed to the parked worker, then cancelled
            await group.wait_idle()
            await trio.testing.wait_all_tasks_blocked()
            assert held.tasks == warm.tasks
            assert held.cancelled == 1
            assert workers.parked == 0
            workers.close()


async def test_a_group_cancel_reaches_every_call_and_its_waiters() -> None:
    calls = [Held() for _ in range(5)]
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            workers = CallWorkers(nursery, keep=8)
            group = CallbackGroup(workers)
            other = CallbackGroup(workers)
            untouched = Held()
            other.start(untouched)
            for call in calls:
                group.start(call)
            await group.all_started()
            assert group.all_running
            group.cancel("the cell closed")
            await group.wait_idle()
            assert [call.cancelled for call in calls] == [1] * 5
            assert untouched.cancelled == 0
            untouched.release.set()
            await other.wait_idle()
            workers.close()


async def test_at_most_keep_workers_park() -> None:
    calls = [Held() for _ in range(5)]
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            workers = CallWorkers(nursery, keep=2)
            group = CallbackGroup(workers)
            for call in calls:
                group.start(call)
            await group.all_started()
            for call in calls:
                call.release.set()
            await group.wait_idle()
            await trio.testing.wait_all_tasks_blocked()
            assert workers.parked == 2
            assert len({task for call in calls for task in call.tasks}) == 5
            workers.close()
            await trio.testing.wait_all_tasks_blocked()
            assert workers.parked == 0


async def test_a_delegate_that_swallows_its_cancellation_still_retires_its_worker() -> None:
    returned = trio.Event()

    async def stubborn() -> None:
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            pass  # a delegate should not, but may
        returned.set()

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            workers = CallWorkers(nursery, keep=4)
            group = CallbackGroup(workers)
            call = group.start(stubborn)
            await group.all_started()
            call.cancel()
            await returned.wait()
            await group.wait_idle()
            await trio.testing.wait_all_tasks_blocked()
            assert workers.parked == 0
            workers.close()


async def test_cancelling_the_nursery_ends_parked_workers() -> None:
    async def quick() -> None:
        await trio.lowlevel.checkpoint()

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            workers = CallWorkers(nursery, keep=4)
            group = CallbackGroup(workers)
            group.start(quick)
            group.start(quick)
            await group.wait_idle()
            await trio.testing.wait_all_tasks_blocked()
            assert workers.parked == 2
            nursery.cancel_scope.cancel()
        assert workers.parked == 0


async def test_after_close_a_busy_worker_ends_with_its_call() -> None:
    held = Held()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            workers = CallWorkers(nursery, keep=4)
            group = CallbackGroup(workers)
            group.start(held)
            await group.all_started()
            workers.close()
            held.release.set()
        # the nursery ended by itself: the worker did not park
    assert held.returned == 1
    assert workers.parked == 0


async def test_workers_start_in_the_owners_context_not_the_callers() -> None:
    tenant: contextvars.ContextVar[str] = contextvars.ContextVar("tenant", default="none")
    seen: list[tuple[str, trio.lowlevel.Task]] = []

    async def call(name: str) -> None:
        seen.append((f"{name}:{tenant.get()}", trio.lowlevel.current_task()))

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            tenant.set("owner")
            workers = CallWorkers(nursery, keep=4)
            done = trio.Event()

            async def from_a_user() -> None:
                tenant.set("user")  # a worker this call starts does not start in this context
                group = CallbackGroup(workers)
                group.start(call, "first")
                await group.wait_idle()
                group.start(call, "second")
                await group.wait_idle()
                done.set()

            nursery.start_soon(from_a_user)
            await done.wait()
            await trio.testing.wait_all_tasks_blocked()
            assert workers.parked == 1
            workers.close()
    assert [name for name, _ in seen] == ["first:owner", "second:owner"]
    assert seen[0][1] is seen[1][1]


# ---- through the providers: a delegate call's context (docs/python-api.md) ---------------------

TENANT: contextvars.ContextVar[str] = contextvars.ContextVar("tenant", default="provider")


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_a_delegate_call_runs_in_the_providers_context_not_the_callers(kind: str) -> None:
    async def tenant_of(call: NestedToolCall) -> JsonValue:
        seen = TENANT.get()
        TENANT.set("leaked")  # never reset: a later call of the same worker may see it
        return seen

    delegate = RecordingDelegate(on_tool=tenant_of)
    # The first call is made while the initial observation yields: it is held, and started by
    # the caller's task once that observation answered (rule 1 of the runtime's `_calls`).
    source = "yield_control(); text(await tools.echo({})); text(await tools.echo({}))"
    with trio.fail_after(30):
        async with session_of(kind) as session:
            TENANT.set("caller")
            yielded = await run(session, delegate, source, tools=[tool("echo")])
            assert isinstance(yielded, Yielded)
            outcome = await session.wait(
                WaitRequest(cell_id=yielded.cell_id, yield_time_ms=LONG_MS)
            )
    assert isinstance(outcome, LiveCell)
    assert isinstance(outcome.response, Completed)
    assert texts(outcome.response)[0] == "provider"
    assert texts(outcome.response)[1] in ("provider", "leaked")


async def test_a_parked_worker_keeps_nothing_of_its_last_call() -> None:
    class Cell:
        async def run(self) -> None:
            await trio.lowlevel.checkpoint()

    async def call(cell: Cell) -> None:
        await cell.run()

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            workers = CallWorkers(nursery, keep=4)
            for _ in range(2):  # the worker's first call, then a later one
                cell = Cell()
                gone = weakref.ref(cell)
                group = CallbackGroup(workers)
                group.start(call, cell)
                del cell
                await group.wait_idle()
                await trio.testing.wait_all_tasks_blocked()
                assert workers.parked == 1
                gc.collect()
                assert gone() is None
            workers.close()


async def test_dismissed_workers_end_and_later_calls_start_new_ones() -> None:
    call = Held()
    call.release.set()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            workers = CallWorkers(nursery, keep=4)
            group = CallbackGroup(workers)
            group.start(call)
            await trio.testing.wait_all_tasks_blocked()
            assert workers.parked == 1
            workers.dismiss_parked()
            assert workers.parked == 0
            await trio.testing.wait_all_tasks_blocked()
            assert len(nursery.child_tasks) == 0  # it ended
            group.start(call)
            await trio.testing.wait_all_tasks_blocked()
            assert workers.parked == 1  # a new worker parks: the pool is not closed
            workers.close()
    assert len(call.tasks) == 2
    assert call.tasks[0] is not call.tasks[1]


async def test_a_call_runs_protected_from_keyboard_interrupt() -> None:
    """Rule 5: the delegate's code runs protected, before and after its first checkpoint, in a
    new worker and in a parked one (also when the build compiles the call workers)."""
    seen: list[bool] = []

    async def call() -> None:
        seen.append(trio.lowlevel.currently_ki_protected())
        await trio.lowlevel.checkpoint()
        seen.append(trio.lowlevel.currently_ki_protected())

    assert not trio.lowlevel.currently_ki_protected()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            workers = CallWorkers(nursery, keep=4)
            group = CallbackGroup(workers)
            for _ in range(2):
                group.start(call)
                await group.wait_idle()
                await trio.testing.wait_all_tasks_blocked()
                assert workers.parked == 1
            workers.close()
    assert seen == [True, True, True, True]


# ---- a call run inline, in the task of the job that runs it (rule 7) ---------------------------


async def test_a_call_run_inline_that_never_suspends_costs_no_other_task() -> None:
    tasks: list[trio.lowlevel.Task] = []
    handed_on: list[trio.lowlevel.Task] = []

    async def at_once() -> None:
        tasks.append(trio.lowlevel.current_task())

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            workers = CallWorkers(nursery, keep=4)
            group = CallbackGroup(workers)
            with trio.CancelScope() as scope:
                worker = Worker(trio.lowlevel.current_task(), scope)
                for _ in range(3):
                    call = group.prepare(at_once)
                    before = (group.all_running, group.idle)
                    await FirstSuspension(
                        call.run_inline(worker),
                        lambda: handed_on.append(trio.lowlevel.current_task()),
                    )
                    assert before == (False, False)
                    assert (group.all_running, group.idle) == (True, True)
            assert workers.parked == 0
            assert len(nursery.child_tasks) == 0
    assert tasks == [trio.lowlevel.current_task()] * 3
    assert handed_on == []


async def test_a_call_run_inline_hands_on_at_its_first_suspension_and_ends_in_its_task() -> None:
    """`suspending()` runs once, when the call first suspends and before its task parks; trio's
    answers (values, exceptions, the call's cancellation) then reach the call as usual."""
    steps: list[str] = []
    send, receive = trio.open_memory_channel[int](1)

    async def suspends() -> None:
        steps.append("began")
        await trio.lowlevel.checkpoint()
        steps.append(f"got {await receive.receive()}")
        try:
            await receive.receive()
        except trio.EndOfChannel:
            steps.append("end of channel")
        await trio.sleep_forever()

    def suspending() -> None:
        steps.append("suspending")
        owner = trio.lowlevel.current_task()
        nursery.start_soon(feed, owner)

    async def feed(owner: trio.lowlevel.Task) -> None:
        # The call's task is parked now, at the call's first checkpoint.
        assert steps == ["began", "suspending"]
        await send.send(42)
        await send.aclose()
        await trio.testing.wait_all_tasks_blocked()
        assert steps[-1] == "end of channel"
        call.cancel("enough")

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            group = CallbackGroup(CallWorkers(nursery, keep=4))
            call = group.prepare(suspends)
            with trio.CancelScope() as scope:
                worker = Worker(trio.lowlevel.current_task(), scope)
                await FirstSuspension(call.run_inline(worker), suspending)
            assert scope.cancelled_caught
            assert group.idle
    assert steps == ["began", "suspending", "got 42", "end of channel"]


async def test_calls_run_inline_in_a_row_hand_on_once_when_a_later_one_suspends() -> None:
    """One `FirstSuspension` serves every call a job runs in a row (a link's reading runs the
    calls of one arrival so): the first returns at once, the second suspends, and only then is
    `suspending()` called, once."""
    steps: list[str] = []

    async def at_once() -> None:
        steps.append("first ran")

    async def suspends() -> None:
        steps.append("second began")
        await trio.lowlevel.checkpoint()
        await trio.lowlevel.checkpoint()
        steps.append("second ended")

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            group = CallbackGroup(CallWorkers(nursery, keep=4))
            calls = [group.prepare(at_once), group.prepare(suspends)]
            with trio.CancelScope() as scope:
                worker = Worker(trio.lowlevel.current_task(), scope)

                async def in_a_row() -> None:
                    for call in calls:
                        await call.run_inline(worker)

                await FirstSuspension(in_a_row(), lambda: steps.append("suspending"))
            assert group.idle
    assert steps == ["first ran", "second began", "suspending", "second ended"]


def _no_op() -> None:
    pass


async def test_a_call_run_inline_fails_as_itself() -> None:
    async def fails_at_once() -> None:
        raise ValueError("at once")

    async def fails_later() -> None:
        await trio.lowlevel.checkpoint()
        raise LookupError("later")

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            group = CallbackGroup(CallWorkers(nursery, keep=4))
            with trio.CancelScope() as scope:
                worker = Worker(trio.lowlevel.current_task(), scope)
                with pytest.raises(ValueError, match="at once"):
                    await FirstSuspension(group.prepare(fails_at_once).run_inline(worker), _no_op)
                with pytest.raises(LookupError, match="later"):
                    await FirstSuspension(group.prepare(fails_later).run_inline(worker), _no_op)
            assert group.idle


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_a_call_that_waits_for_a_later_call_of_its_cell_gets_it(kind: str) -> None:
    """A host link runs a tool call inline in its reading; one that suspends hands the reading
    on, so the call it waits for (sent after it) still arrives (`codemode/_wire/_stream.py`)."""
    released = trio.Event()

    async def tools(call: NestedToolCall) -> JsonValue:
        if call.tool_name.name == "wait":
            await released.wait()
            return "waited"
        released.set()
        return "released"

    source = "text((await Promise.all([tools.wait({}), tools.release({})])).join(' '))"
    with trio.fail_after(30):
        async with session_of(kind) as session:
            delegate = RecordingDelegate(on_tool=tools)
            response = await run(session, delegate, source, tools=[tool("wait"), tool("release")])
    assert isinstance(response, Completed)
    assert texts(response) == ["waited released"]
