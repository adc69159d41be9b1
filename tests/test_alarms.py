"""`codemode._trio.Alarms`: many deadlines served by one task (its rules 1-3), on trio's
autojumping mock clock: the sleeps below take no real time."""

from __future__ import annotations

import gc
import logging
import weakref
from collections.abc import Callable

import pytest
import trio
import trio.testing

from codemode._trio import Alarms


async def test_alarms_run_in_deadline_order_and_never_early(
    autojump_clock: trio.testing.MockClock,
) -> None:
    alarms = Alarms()
    ran: list[tuple[str, float]] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(alarms.run)
        start = trio.current_time()

        def record(name: str) -> Callable[[], None]:
            return lambda: ran.append((name, trio.current_time()))

        for name, delay in (("c", 3.0), ("a", 1.0), ("b", 2.0), ("a2", 1.0)):
            alarms.call_at(start + delay, record(name))
        await trio.sleep(5)
        nursery.cancel_scope.cancel()
    assert [name for name, _ in ran] == ["a", "a2", "b", "c"]
    assert [when - start for _, when in ran] == [1.0, 1.0, 2.0, 3.0]


async def test_an_earlier_alarm_wakes_the_sleeping_task_sooner(
    autojump_clock: trio.testing.MockClock,
) -> None:
    alarms = Alarms()
    ran: list[float] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(alarms.run)
        start = trio.current_time()
        alarms.call_at(start + 100, lambda: ran.append(trio.current_time()))
        await trio.testing.wait_all_tasks_blocked()  # the task sleeps until +100
        alarms.call_at(start + 1, lambda: ran.append(trio.current_time()))
        await trio.sleep(2)
        nursery.cancel_scope.cancel()
    assert [when - start for when in ran] == [1.0]


async def test_a_cancelled_alarm_never_runs_and_drops_its_function(
    autojump_clock: trio.testing.MockClock,
) -> None:
    alarms = Alarms()
    ran: list[str] = []

    class Owner:
        def fire(self) -> None:
            ran.append("owner")

    owner = Owner()
    gone = weakref.ref(owner)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(alarms.run)
        start = trio.current_time()
        alarm = alarms.call_at(start + 1, owner.fire)
        kept = alarms.call_at(start + 1, lambda: ran.append("kept"))
        alarm.cancel()
        alarm.cancel()  # a second cancel is nothing
        del owner
        gc.collect()
        assert gone() is None  # the cancelled entry still in the heap keeps nothing alive
        assert not alarm.pending
        assert kept.pending
        await trio.sleep(2)
        nursery.cancel_scope.cancel()
    assert ran == ["kept"]
    assert len(alarms) == 0


async def test_cancelled_alarms_do_not_pile_up() -> None:
    alarms = Alarms()
    start = trio.current_time()
    # Never served: the heap is compacted by cancels alone.
    for index in range(10_000):
        alarms.call_at(start + 100 + index, lambda: None).cancel()
    assert len(alarms) <= 200


async def test_a_failing_alarm_is_logged_and_the_others_run(
    caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    alarms = Alarms()
    ran: list[str] = []

    def broken() -> None:
        raise LookupError("no such thing")

    with caplog.at_level(logging.ERROR, logger="codemode.alarms"):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(alarms.run)
            start = trio.current_time()
            alarms.call_at(start + 1, broken)
            alarms.call_at(start + 1, lambda: ran.append("after"))
            await trio.sleep(2)
            nursery.cancel_scope.cancel()
    assert ran == ["after"]
    assert "an alarm's function raised" in caplog.text
