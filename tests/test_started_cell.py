"""Who gives a cell's initial observation up, on every provider: awaiting the `StartedCell`,
`release()`, `async with started:`, `execute(..., observe_initial=False)`; dropping it
unreleased still releases it, but warns (`ResourceWarning`).
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager

import pytest
import trio

import codemode
from codemode import (
    CodeModeError,
    Completed,
    InputText,
    LiveCell,
    MissingCell,
    ObserverBusyError,
    Session,
    StartedCell,
    WaitRequest,
    Yielded,
)
from tests.delegates import RecordingDelegate
from tests.remote_hosts import listening_host
from tests.sessions import execute, texts

KINDS = [
    "in-process",
    pytest.param("process", marks=pytest.mark.slow),
    pytest.param("remote", marks=pytest.mark.slow),
]

# Its text, its `yield_control()` and its notification come in this order: once the delegate
# has the notification, the cell has completed or is about to, and all its output is buffered.
PRINTS = 'text("a"); yield_control(); text("b"); notify("done")'
HOLDS = 'text("a"); notify("ready"); await new Promise(() => {})'


@asynccontextmanager
async def session_of(kind: str) -> AsyncIterator[Session]:
    if kind == "in-process":
        async with codemode.open_in_process_provider() as provider:
            yield await provider.create_session()
    elif kind == "process":
        async with codemode.open_process_provider() as provider:
            yield await provider.create_session()
    else:
        async with (
            listening_host() as host,
            codemode.open_remote_provider([host.address]) as provider,
        ):
            yield await provider.create_session()


@contextmanager
def no_resource_warning() -> Iterator[None]:
    """Fails if anything in the block (a collection included) warns `ResourceWarning`."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
        gc.collect()
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []


# ---- observe_initial=False -----------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_a_cell_started_unobserved_gives_all_its_output_to_the_next_wait(kind: str) -> None:
    delegate = RecordingDelegate()
    with trio.fail_after(30):
        async with session_of(kind) as session:
            started = await execute(session, delegate, PRINTS, observe_initial=False)
            await delegate.until(lambda: len(delegate.notifications) == 1)
            outcome = await session.wait(WaitRequest(cell_id=started.cell_id))
    assert isinstance(outcome, LiveCell)
    assert isinstance(outcome.response, Completed)
    assert texts(outcome) == ["a", "b"]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_wait_made_at_once_after_an_unobserved_execute_observes_the_cell(
    kind: str,
) -> None:
    # No ObserverBusyError: nothing holds the initial observation, not even for a moment
    # (over the wire the wait waits for the host to give the initial observation up).
    delegate = RecordingDelegate()
    with trio.fail_after(30):
        async with session_of(kind) as session:
            started = await execute(
                session, delegate, 'text("a"); text("b")', observe_initial=False
            )
            outcome = await session.wait(WaitRequest(cell_id=started.cell_id))
    assert isinstance(outcome, LiveCell)
    assert outcome.response == Completed(
        cell_id="1",
        content_items=[InputText(text="a"), InputText(text="b")],
        host_duration=outcome.response.host_duration,
    )


@pytest.mark.parametrize("kind", KINDS)
async def test_an_unobserved_started_cell_is_released_already_and_never_warns(kind: str) -> None:
    delegate = RecordingDelegate()
    with trio.fail_after(30):
        async with session_of(kind) as session:
            started = await execute(session, delegate, HOLDS, observe_initial=False)
            with pytest.raises(
                CodeModeError,
                match=r"^the initial response of exec cell 1 was already taken or released$",
            ):
                await started.initial_response()
            started.release()  # idempotent, as for any released cell
            async with started:
                pass
            await delegate.until(lambda: len(delegate.notifications) == 1)
            with no_resource_warning():
                del started
            outcome = await session.wait(WaitRequest(cell_id="1", yield_time_ms=1))
            await session.terminate("1")
    assert isinstance(outcome, LiveCell)
    assert isinstance(outcome.response, Yielded)
    assert texts(outcome) == ["a"]


# ---- dropped unreleased: it warns ----------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_a_started_cell_dropped_unreleased_warns_and_still_releases(kind: str) -> None:
    delegate = RecordingDelegate()
    with trio.fail_after(30):
        async with session_of(kind) as session:
            started = await execute(session, delegate, HOLDS)
            await delegate.until(lambda: len(delegate.notifications) == 1)
            with pytest.warns(ResourceWarning) as caught:
                del started
            outcome = await session.wait(WaitRequest(cell_id="1", yield_time_ms=1))
            await session.terminate("1")
    assert [str(w.message) for w in caught] == [
        "StartedCell of exec cell '1' of session 'session-1' was dropped without its initial"
        " response being awaited or released (it is released now). Await"
        " `started.initial_response()`, call `started.release()`, use `async with started:`,"
        " or pass `observe_initial=False` to `execute`"
    ]
    assert texts(outcome) == ["a"]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_started_cell_held_by_a_cycle_warns_when_the_collector_frees_it(
    kind: str,
) -> None:
    # The case the warning is for: until the collector runs, the cell stays held.
    delegate = RecordingDelegate()
    with trio.fail_after(30):
        async with session_of(kind) as session:
            cycle: list[object] = [await execute(session, delegate, HOLDS)]
            cycle.append(cycle)
            await delegate.until(lambda: len(delegate.notifications) == 1)
            gc.disable()  # a collection of its own would free the cycle before the warns block
            try:
                del cycle
                with pytest.raises(ObserverBusyError):
                    await session.wait(WaitRequest(cell_id="1", yield_time_ms=1))
                with pytest.warns(ResourceWarning, match=r"^StartedCell of exec cell '1' "):
                    gc.collect()
            finally:
                gc.enable()
            outcome = await session.wait(WaitRequest(cell_id="1", yield_time_ms=1))
            await session.terminate("1")
    assert texts(outcome) == ["a"]


# ---- released or awaited: no warning -------------------------------------------------------


async def _await_it(started: StartedCell) -> None:
    response = await started.initial_response()
    assert isinstance(response, Completed)
    assert texts(response) == ["a"]


async def _release_it(started: StartedCell) -> None:
    started.release()


async def _enter_it(started: StartedCell) -> None:
    async with started:
        pass


async def _cancel_its_await(started: StartedCell) -> None:
    with trio.CancelScope() as scope:
        scope.cancel()
        await started.initial_response()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("settle", [_await_it, _release_it, _enter_it, _cancel_its_await])
async def test_a_started_cell_awaited_or_released_does_not_warn_when_dropped(
    kind: str, settle: Callable[[StartedCell], Awaitable[None]]
) -> None:
    delegate = RecordingDelegate()
    with trio.fail_after(30):
        async with session_of(kind) as session:
            started = await execute(session, delegate, 'text("a"); notify("done")')
            await settle(started)
            await delegate.until(lambda: len(delegate.notifications) == 1)
            with no_resource_warning():
                del started
            outcome = await session.wait(WaitRequest(cell_id="1"))
    if settle is _await_it:
        assert isinstance(outcome, MissingCell)  # the initial response took its completion
    else:
        assert isinstance(outcome, LiveCell)
        assert isinstance(outcome.response, Completed)
        assert texts(outcome) == ["a"]
