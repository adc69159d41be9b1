"""Idempotency keys (docs/python-api.md, "Idempotency keys"): a repeated request with the same
key gets the first one's outcome instead of acting again, on every provider, and a repeated call
of the model's `exec` or `wait` gets the first call's output.

The tests that take only `session`, `delegate` or `provider` run on every provider
(tests/conftest.py) and again through `codemode.aio` (tests/test_aio.py, `test_the_contract`).
The bounds are checked in-process, on trio's mock clock, and on the book itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.testing

import codemode
from codemode import (
    CodeMode,
    CodeModeError,
    Completed,
    ExecuteRequest,
    InvalidRequestError,
    LiveCell,
    MissingCell,
    ObserverBusyError,
    RuntimeResponse,
    Session,
    StartedCell,
    Terminated,
    ToolOutput,
    WaitOutcome,
    WaitRequest,
    Yielded,
    _idempotency,
)
from codemode._idempotency import KEY_SECONDS, MAX_KEYS, IdempotencyBook
from tests.conftest import Provider
from tests.delegates import RecordingDelegate
from tests.sessions import LONG_MS, all_tasks_blocked, execute, texts, tool

KEY = "retry-1"
COUNTS = "text(JSON.stringify(await tools.count({})))"
"""A cell that calls its tool once: the delegate's invocations count the cells that ran."""
OUTPUT = '{"value":"output"}'
HELD = 'text("a"); text(JSON.stringify(await tools.count({})))'
"""Prints, then waits for its tool, which the delegate holds until told."""


def request(source: str = COUNTS, *, window: int | None = LONG_MS) -> ExecuteRequest:
    return ExecuteRequest(
        tool_call_id="call-1", source=source, enabled_tools=[tool("count")], yield_time_ms=window
    )


def reused(key: str = KEY) -> str:
    return f"idempotency key {key!r} was already used for a different request"


async def started_held(session: Session, delegate: RecordingDelegate) -> str:
    """A cell that printed `a` and waits for its held tool, nobody observing it: its id."""
    delegate.hold_tools = True
    started = await execute(session, delegate, HELD, tools=[tool("count")], observe_initial=False)
    await delegate.until(lambda: len(delegate.invocations) == 1)
    return started.cell_id


# ---- execute -------------------------------------------------------------------------------


async def test_a_repeated_execute_returns_the_same_cell_and_its_first_response(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(30):
        first = await session.execute(request(), delegate, idempotency_key=KEY)
        again = await session.execute(request(), delegate, idempotency_key=KEY)
        assert again.cell_id == first.cell_id
        response = await first.initial_response()
        assert isinstance(response, Completed)
        assert texts(response) == [OUTPUT]
        assert await again.initial_response() == response
        later = await session.execute(request(), delegate, idempotency_key=KEY)
        assert later.cell_id == first.cell_id
        assert await later.initial_response() == response
        assert len(delegate.invocations) == 1  # one cell ran
        other = await session.execute(request(), delegate)  # no key: a new cell
        assert other.cell_id != first.cell_id
        await other.initial_response()
        assert len(delegate.invocations) == 2


async def test_repeated_executes_in_flight_start_one_cell(
    session: Session, delegate: RecordingDelegate
) -> None:
    delegate.hold_tools = True
    started: list[StartedCell] = []
    responses: list[RuntimeResponse] = []

    async def keyed() -> None:
        cell = await session.execute(request(HELD), delegate, idempotency_key=KEY)
        started.append(cell)
        responses.append(await cell.initial_response())

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(keyed)
            nursery.start_soon(keyed)  # finds the first one in flight, and waits for it
            await delegate.until(lambda: len(delegate.invocations) == 1)
            await all_tasks_blocked()
            delegate.release.set()
    assert [cell.cell_id for cell in started] == [started[0].cell_id] * 2
    assert responses[0] == responses[1]
    assert texts(responses[0]) == ["a", OUTPUT]
    assert len(delegate.invocations) == 1


async def test_the_initial_response_given_up_unanswered_is_observed_by_the_repeat(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(30):
        first = await session.execute(request('text("a")'), delegate, idempotency_key=KEY)
        first.release()  # the session's `wait`s may observe the cell now
        again = await session.execute(request('text("a")'), delegate, idempotency_key=KEY)
        response = await again.initial_response()  # as a `wait` gets it: nothing lost
        assert isinstance(response, Completed)
        assert texts(response) == ["a"]
        later = await session.execute(request('text("a")'), delegate, idempotency_key=KEY)
        assert await later.initial_response() == response
        # Each StartedCell still answers once.
        with pytest.raises(CodeModeError) as raised:
            await again.initial_response()
        assert str(raised.value) == (
            f"the initial response of exec cell {again.cell_id} was already taken or released"
        )


async def test_a_keyed_execute_unobserved_gives_the_repeat_all_its_output(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(30):
        source = 'text("a"); notify("done")'
        first = await session.execute(
            request(source), delegate, observe_initial=False, idempotency_key=KEY
        )
        await delegate.until(lambda: len(delegate.notifications) == 1)
        again = await session.execute(request(source), delegate, idempotency_key=KEY)
        assert again.cell_id == first.cell_id
        response = await again.initial_response()
        assert isinstance(response, Completed)
        assert texts(response) == ["a"]


async def test_execute_to_pending_repeated_returns_the_same_frontier(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(30):
        first = await session.execute_to_pending(request(), delegate, idempotency_key=KEY)
        again = await session.execute_to_pending(request(), delegate, idempotency_key=KEY)
        assert again == first
        assert len(delegate.invocations) == 1
        await session.terminate(first.cell_id)


# ---- wait, terminate -------------------------------------------------------------------------


async def test_a_repeated_wait_gets_the_final_response_again(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(30):
        started = await execute(session, delegate, 'text("a"); yield_control(); text("b")')
        assert isinstance(await started.initial_response(), Yielded)
        wait = WaitRequest(cell_id=started.cell_id, yield_time_ms=LONG_MS)
        done = await session.wait(wait, idempotency_key=KEY)
        assert isinstance(done, LiveCell)
        assert isinstance(done.response, Completed)
        assert texts(done) == ["b"]
        assert await session.wait(wait, idempotency_key=KEY) == done  # not MissingCell
        assert isinstance(await session.wait(wait), MissingCell)  # the cell itself is gone


async def test_a_repeated_terminate_gets_the_same_outcome(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(30):
        cell_id = await started_held(session, delegate)
        stopped = await session.terminate(cell_id, idempotency_key=KEY)
        assert isinstance(stopped, LiveCell)
        assert isinstance(stopped.response, Terminated)
        assert await session.terminate(cell_id, idempotency_key=KEY) == stopped
        assert isinstance(await session.terminate(cell_id), MissingCell)


async def test_a_repeated_wait_in_flight_waits_for_the_first(
    session: Session, delegate: RecordingDelegate
) -> None:
    outcomes: list[WaitOutcome] = []
    with trio.fail_after(30):
        cell_id = await started_held(session, delegate)
        wait = WaitRequest(cell_id=cell_id, yield_time_ms=LONG_MS)

        async def keyed() -> None:
            outcomes.append(await session.wait(wait, idempotency_key=KEY))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(keyed)
            await all_tasks_blocked()
            # An observation of its own would be refused (one observer at a time) ...
            with pytest.raises(ObserverBusyError):
                await session.wait(wait)
            nursery.start_soon(keyed)  # ... the repeat waits for the first one's outcome
            await all_tasks_blocked()
            delegate.release.set()
    assert outcomes[0] == outcomes[1]
    assert isinstance(outcomes[0].response, Completed)
    assert texts(outcomes[0]) == ["a", OUTPUT]


async def test_cancelling_a_repeat_leaves_the_first_alone(
    session: Session, delegate: RecordingDelegate
) -> None:
    outcomes: list[WaitOutcome] = []
    with trio.fail_after(30):
        cell_id = await started_held(session, delegate)
        wait = WaitRequest(cell_id=cell_id, yield_time_ms=LONG_MS)

        async def keyed() -> None:
            outcomes.append(await session.wait(wait, idempotency_key=KEY))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(keyed)
            await all_tasks_blocked()
            with trio.CancelScope() as repeat:
                repeat.cancel()
                await session.wait(wait, idempotency_key=KEY)
            delegate.release.set()
        assert texts(outcomes[0]) == ["a", OUTPUT]
        assert await session.wait(wait, idempotency_key=KEY) == outcomes[0]


async def test_a_cancelled_request_leaves_its_key_new(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(30):
        cell_id = await started_held(session, delegate)
        wait = WaitRequest(cell_id=cell_id, yield_time_ms=LONG_MS)
        async with trio.open_nursery() as nursery:

            async def cancelled() -> None:
                await session.wait(wait, idempotency_key=KEY)
                raise AssertionError("the wait was cancelled")  # pragma: no cover

            nursery.start_soon(cancelled)
            await all_tasks_blocked()
            nursery.cancel_scope.cancel()
        delegate.release.set()
        # No outcome: the repeat observes anew, and gets what the cancelled wait did not take.
        outcome = await session.wait(wait, idempotency_key=KEY)
        assert isinstance(outcome.response, Completed)
        assert texts(outcome) == ["a", OUTPUT]


async def test_an_error_is_the_outcome_its_repeat_gets(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(30):
        cell_id = await started_held(session, delegate)
        wait = WaitRequest(cell_id=cell_id, yield_time_ms=LONG_MS)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(session.wait, wait)
            await all_tasks_blocked()
            errors = []
            for _ in range(2):
                with pytest.raises(ObserverBusyError) as raised:
                    await session.wait(wait, idempotency_key=KEY)
                errors.append(raised.value)
            assert errors[0] is not errors[1]
            assert (
                str(errors[1])
                == str(errors[0])
                == f"exec cell {cell_id} already has an active observer"
            )
            delegate.release.set()


# ---- keys ----------------------------------------------------------------------------------


async def test_a_key_used_for_another_request_is_refused(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(30):
        started = await session.execute(request(), delegate, idempotency_key=KEY)
        await started.initial_response()
        wait = WaitRequest(cell_id=started.cell_id, yield_time_ms=LONG_MS)
        refused: list[Callable[[], Awaitable[object]]] = [
            lambda: session.execute(request("text(2)"), delegate, idempotency_key=KEY),
            lambda: session.execute_to_pending(request(), delegate, idempotency_key=KEY),
            lambda: session.wait(wait, idempotency_key=KEY),
            lambda: session.terminate(started.cell_id, idempotency_key=KEY),
            lambda: session.wait_to_pending(started.cell_id, idempotency_key=KEY),
        ]
        for operation in refused:
            with pytest.raises(InvalidRequestError) as raised:
                await operation()
            assert str(raised.value) == reused()
        await session.wait(wait, idempotency_key="w")
        with pytest.raises(InvalidRequestError) as raised:
            await session.wait(
                WaitRequest(cell_id=started.cell_id, yield_time_ms=0), idempotency_key="w"
            )
        assert str(raised.value) == reused("w")
        assert len(delegate.invocations) == 1


async def test_keys_are_checked(session: Session, delegate: RecordingDelegate) -> None:
    with trio.fail_after(30):
        for key, text in [
            (
                "",
                "invalid code-mode request: idempotency_key must be 1 to 256 characters long, got 0",
            ),
            (
                "k" * 257,
                "invalid code-mode request: idempotency_key must be 1 to 256 characters long, got 257",
            ),
            (7, "invalid code-mode request: idempotency_key must be None or a str, got int"),
        ]:
            with pytest.raises(InvalidRequestError) as raised:
                await session.execute(request(), delegate, idempotency_key=key)  # type: ignore[arg-type]
            assert str(raised.value) == text
            with pytest.raises(InvalidRequestError):
                await session.terminate("1", idempotency_key=key)  # type: ignore[arg-type]
        assert delegate.invocations == []
        started = await session.execute(request(), delegate, idempotency_key="k" * 256)
        await started.initial_response()


async def test_keys_are_per_session(provider: Provider, delegate: RecordingDelegate) -> None:
    with trio.fail_after(30):
        first = await provider.create_session()
        second = await provider.create_session()
        for session in (first, second):
            started = await session.execute(request(), delegate, idempotency_key=KEY)
            await started.initial_response()
        assert len(delegate.invocations) == 2


# ---- the model's calls ---------------------------------------------------------------------


async def test_the_model_s_repeated_exec_runs_one_cell(
    session: Session, delegate: RecordingDelegate
) -> None:
    code_mode = CodeMode(session, delegate, [tool("count")])
    with trio.fail_after(30):
        first = await code_mode.exec("call-1", COUNTS)
        again = await code_mode.call("exec", "call-1", COUNTS)
        assert again == first
        assert first.status == "completed"
        assert len(delegate.invocations) == 1
        # The same id with other code is another call (a framework that reuses ids).
        other = await code_mode.exec("call-1", f"text(1); {COUNTS}")
        assert other.cell_id != first.cell_id
        assert len(delegate.invocations) == 2


async def test_the_model_s_repeated_wait_gets_the_final_output_again(
    session: Session, delegate: RecordingDelegate
) -> None:
    code_mode = CodeMode(session, delegate, [tool("count")])
    with trio.fail_after(30):
        running = await code_mode.exec("call-1", 'text("a"); yield_control(); text("b")')
        assert running.status == "running"
        arguments = {"cell_id": running.cell_id, "yield_time_ms": LONG_MS}
        done = await code_mode.call("wait", "call-2", arguments)
        assert done.status == "completed"
        assert await code_mode.call("wait", "call-2", arguments) == done
        assert await code_mode.wait(arguments, "call-2") == done
        gone = await code_mode.wait(arguments)  # no id: a new call, and the cell is gone
        assert gone.status == "failed"
        assert gone.text.endswith(f"exec cell {running.cell_id} not found")


async def test_the_model_s_repeated_exec_in_flight_waits_for_the_first(
    session: Session, delegate: RecordingDelegate
) -> None:
    code_mode = CodeMode(session, delegate, [tool("count")])
    delegate.hold_tools = True
    outputs: list[ToolOutput] = []

    async def call() -> None:
        outputs.append(await code_mode.exec("call-1", HELD))

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call)
            nursery.start_soon(call)
            await delegate.until(lambda: len(delegate.invocations) == 1)
            await all_tasks_blocked()
            delegate.release.set()
    assert outputs[0] == outputs[1]
    assert outputs[0].status == "completed"
    assert len(delegate.invocations) == 1


async def test_the_model_s_cancelled_exec_repeated_runs_anew(
    session: Session, delegate: RecordingDelegate
) -> None:
    code_mode = CodeMode(session, delegate, [tool("count")])
    delegate.hold_tools = True
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(code_mode.exec, "call-1", HELD)
            await delegate.until(lambda: len(delegate.invocations) == 1)
            await all_tasks_blocked()
            nursery.cancel_scope.cancel()  # the framework gave up: the cell is terminated
        await delegate.until(lambda: len(delegate.closed) == 1)
        delegate.hold_tools = False
        output = await code_mode.exec("call-1", HELD)  # no outcome to repeat: a new cell
        assert output.status == "completed"
        assert output.cell_id != delegate.closed[0]
        assert len(delegate.invocations) == 2


# ---- the bounds ----------------------------------------------------------------------------


@pytest.fixture
def patient_clock() -> trio.testing.MockClock:
    """Trio's mock clock, jumped by hand; it jumps by itself only after a second of real time
    with every task blocked (a test stuck waiting reaches its `fail_after`), never while the
    engine's threads run a cell."""
    return trio.testing.MockClock(autojump_threshold=1.0)


async def test_a_key_is_forgotten_ten_minutes_after_its_request_ended(
    patient_clock: trio.testing.MockClock,
) -> None:
    delegate = RecordingDelegate()
    with trio.fail_after(KEY_SECONDS + 30):  # on the mock clock, past the jumps below
        async with codemode.open_in_process_provider() as provider:
            session = await provider.create_session()
            started = await execute(session, delegate, 'text("a"); notify("done")')
            await delegate.until(lambda: len(delegate.notifications) == 1)
            started.release()
            wait = WaitRequest(cell_id=started.cell_id, yield_time_ms=LONG_MS)
            done = await session.wait(wait, idempotency_key=KEY)
            assert texts(done) == ["a"]
            patient_clock.jump(KEY_SECONDS - 1)
            assert await session.wait(wait, idempotency_key=KEY) == done
            patient_clock.jump(1)
            assert isinstance(await session.wait(wait, idempotency_key=KEY), MissingCell)


async def test_the_oldest_key_is_forgotten_past_the_count() -> None:
    with trio.fail_after(30):
        async with codemode.open_in_process_provider() as provider:
            session = await provider.create_session()
            for index in range(MAX_KEYS + 1):
                await session.terminate("1", idempotency_key=f"key-{index}")
            # `key-0` was dropped: it is new again (and taking it drops `key-1`); `key-2` is
            # still held, for a terminate.
            await session.wait(WaitRequest(cell_id="1"), idempotency_key="key-0")
            with pytest.raises(InvalidRequestError) as raised:
                await session.wait(WaitRequest(cell_id="1"), idempotency_key="key-2")
            assert str(raised.value) == reused("key-2")


async def test_the_oldest_outcomes_are_forgotten_past_the_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A remembered wait keeps its response and a keyed execute its initial response, output
    and all: past `MAX_KEPT_BYTES` the oldest keys go, so a session's keys cannot hold a
    thousand large outputs."""
    monkeypatch.setattr(_idempotency, "MAX_KEPT_BYTES", 1500)
    delegate = RecordingDelegate()
    prints = request('text("c".repeat(1000))')
    with trio.fail_after(30):
        async with codemode.open_in_process_provider() as provider:
            session = await provider.create_session()
            first = await session.execute(prints, delegate, idempotency_key="exec")
            assert texts(await first.initial_response()) == ["c" * 1000]  # counted once taken
            started = await execute(
                session, delegate, 'text("a"); yield_control(); text("b".repeat(1000))'
            )
            assert isinstance(await started.initial_response(), Yielded)
            wait = WaitRequest(cell_id=started.cell_id, yield_time_ms=LONG_MS)
            done = await session.wait(wait, idempotency_key="wait")
            assert texts(done) == ["b" * 1000]
            # 2,000 held: `exec`, the oldest, went.
            assert await session.wait(wait, idempotency_key="wait") == done
            again = await session.execute(prints, delegate, idempotency_key="exec")
            assert again.cell_id != first.cell_id  # new again: another cell
            assert texts(await again.initial_response()) == ["c" * 1000]
            # 2,000 held again: `wait` went, and a new wait of the closed cell finds nothing.
            assert isinstance(await session.wait(wait, idempotency_key="wait"), MissingCell)


async def test_the_model_s_oldest_outputs_are_forgotten_past_the_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_idempotency, "MAX_KEPT_BYTES", 1500)
    delegate = RecordingDelegate()
    prints = 'text("c".repeat(1000))'
    with trio.fail_after(30):
        async with codemode.open_in_process_provider() as provider:
            code_mode = CodeMode(await provider.create_session(), delegate, [])
            first = await code_mode.exec("call-1", prints)
            assert await code_mode.exec("call-1", prints) == first  # 1,000 and a header held
            await code_mode.exec("call-2", prints)
            again = await code_mode.exec("call-1", prints)  # forgotten: runs anew
            assert again.cell_id != first.cell_id


async def test_the_book_drops_ended_outcomes_oldest_first_past_its_bytes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    book = IdempotencyBook(max_bytes=10, measure=lambda outcome: len(str(outcome)))
    calls: list[str] = []
    gate = trio.Event()

    def acting(text: str) -> Callable[[], Awaitable[str]]:
        async def act() -> str:
            calls.append(text)
            if text == "slow":
                await gate.wait()
            await trio.lowlevel.checkpoint()
            return text

        return act

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(book.run, "in-flight", "op", acting("slow"))
            await trio.testing.wait_all_tasks_blocked()
            for key in "abc":
                assert await book.run(key, "op", acting(key * 4)) == key * 4
            # a (4) went when c made 12: the one in flight stays, it holds nothing yet.
            assert (len(book), book.kept_bytes) == (3, 8)
            assert await book.run("b", "op", acting("bbbb")) == "bbbb"
            assert await book.run("a", "op", acting("aaaa")) == "aaaa"
            assert calls == ["slow", "aaaa", "bbbb", "cccc", "aaaa"]
            # Larger than the bound: returned, and every ended outcome goes, itself last.
            assert await book.run("huge", "op", acting("x" * 11)) == "x" * 11
            assert (len(book), book.kept_bytes) == (1, 0)
            gate.set()
        assert (len(book), book.kept_bytes) == (1, 4)  # "slow", ended
        assert await book.run("in-flight", "op", acting("slow")) == "slow"
        assert calls.count("slow") == 1


async def test_the_book_forgets_what_ended_without_an_outcome(
    autojump_clock: trio.testing.MockClock,
) -> None:
    book = IdempotencyBook()
    calls: list[str] = []

    async def fails() -> str:
        calls.append("fails")
        await trio.lowlevel.checkpoint()
        raise KeyError("a bug")

    async def works() -> str:
        calls.append("works")
        await trio.lowlevel.checkpoint()
        return "done"

    with trio.fail_after(10):
        with pytest.raises(KeyError):
            await book.run("k", "op", fails)
        assert await book.run("k", "op", works) == "done"
        assert await book.run("k", "op", works) == "done"
        assert calls == ["fails", "works"]
        assert await book.run(None, "op", works) == "done"  # no key: it simply runs
        assert calls == ["fails", "works", "works"]


async def test_the_book_copies_the_errors_it_repeats(
    autojump_clock: trio.testing.MockClock,
) -> None:
    book = IdempotencyBook()

    async def busy() -> None:
        await trio.lowlevel.checkpoint()
        raise ObserverBusyError("3")

    with trio.fail_after(10):
        raised = []
        for _ in range(3):
            with pytest.raises(ObserverBusyError) as caught:
                await book.run("k", "op", busy)
            raised.append(caught.value)
        assert len({id(error) for error in raised}) == 3
        assert {str(error) for error in raised} == {"exec cell 3 already has an active observer"}
        assert {error.cell_id for error in raised} == {"3"}


async def test_the_book_answers_the_waiters_of_a_key_it_dropped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    book = IdempotencyBook(max_keys=1)
    gate = trio.Event()
    answers: list[str] = []

    async def slow() -> str:
        await gate.wait()
        return "first"

    async def keyed(key: str) -> None:
        answers.append(await book.run(key, "op", slow))

    with trio.fail_after(KEY_SECONDS + 10):  # past the jump below
        async with trio.open_nursery() as nursery:
            nursery.start_soon(keyed, "a")
            nursery.start_soon(keyed, "a")  # waits for the first
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(keyed, "b")  # drops `a`, still in flight
            await trio.testing.wait_all_tasks_blocked()
            assert len(book) == 1
            gate.set()
        assert answers == ["first"] * 3
        with pytest.raises(InvalidRequestError):
            await book.run("b", "other", slow)  # held: another request under it is refused
        autojump_clock.jump(KEY_SECONDS)
        assert await book.run("b", "other", slow) == "first"  # forgotten: new again


def test_the_asyncio_code_mode_repeats_a_call_with_its_id() -> None:
    from codemode import aio
    from tests.test_aio import run_on_asyncio

    async def main() -> None:
        async with aio.open_in_process_provider() as provider:
            session = await provider.create_session()
            toolbox = codemode.Toolbox()
            code_mode = aio.CodeMode(session, toolbox, toolbox.definitions())
            source = 'text("a"); yield_control(); text("b")'
            running = await code_mode.call("exec", "call-1", source)
            assert running.status == "running"
            assert await code_mode.exec("call-1", source) == running  # the same cell
            arguments = {"cell_id": running.cell_id, "yield_time_ms": LONG_MS}
            done = await code_mode.call("wait", "call-2", arguments)
            assert done.status == "completed"
            assert await code_mode.wait(arguments, "call-2") == done  # not `not found`

    run_on_asyncio(main)
