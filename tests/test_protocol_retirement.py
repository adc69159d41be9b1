"""Random operation sequences through the in-memory connection pair: no output is ever lost.

The host side is played by `FakeRuntime`, a model of the runtime's observation rules (one
observer per cell; an answer takes every buffered item; a cancelled observation takes nothing;
a terminate takes the rest). Hypothesis drives the user (execute, take or release the initial
response, wait, cancel any observation, terminate), the cells (emit output, finish), the host's
answers and the delivery of bytes in both directions, in any order and cut anywhere. At the end
everything is drained, and every item a cell emitted must have reached the user exactly once,
in order (design.md, style 17: plain hypothesis on the sync core).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from codemode import (
    Completed,
    ContentItem,
    ExecuteRequest,
    InputText,
    LiveCell,
    RuntimeResponse,
    Terminated,
    Yielded,
    missing_cell,
)
from codemode.protocol import (
    Answered,
    CancelRequested,
    Err,
    ErrorKind,
    Execute,
    ExecutionStarted,
    InitialAnswered,
    Ok,
    RequestReceived,
    SessionReady,
    Terminate,
    Wait,
    WaitCompleted,
)
from tests.protocol_pair import Pair

SESSION = "s"


@dataclass
class FakeCell:
    cell_id: str
    initial: int
    pending: list[str] = field(default_factory=list)
    observer: int | None = None
    observer_is_initial: bool = False
    done: bool = False
    closed: bool = False
    emitted: int = 0


class FakeRuntime:
    """The host's runtime, reduced to the rules that decide who gets which output."""

    def __init__(self, pair: Pair) -> None:
        self.pair = pair
        self.cells: dict[str, FakeCell] = {}
        self.emitted: list[str] = []

    def handle(self, event: object) -> None:
        host = self.pair.host
        match event:
            case RequestReceived(request_id=rid, request=Execute()):
                cell = FakeCell(str(len(self.cells) + 1), rid)
                self.cells[cell.cell_id] = cell
                host.respond(rid, Ok(value=ExecutionStarted(cell_id=cell.cell_id)))
                cell.observer, cell.observer_is_initial = rid, True
            case RequestReceived(request_id=rid, request=Wait(request=wait)):
                cell = self.cells.get(wait.cell_id)  # type: ignore[assignment]
                if cell is None or cell.closed:
                    host.respond(rid, Ok(value=WaitCompleted(outcome=missing_cell(wait.cell_id))))
                elif cell.observer is not None:
                    busy = f"exec cell {cell.cell_id} already has an active observer"
                    host.respond(rid, Err(kind=ErrorKind.OBSERVER_BUSY, message=busy))
                else:
                    cell.observer, cell.observer_is_initial = rid, False
                    if cell.done:
                        self.answer(cell)
            case RequestReceived(request_id=rid, request=Terminate(cell_id=cell_id)):
                cell = self.cells.get(cell_id)  # type: ignore[assignment]
                if cell is None or cell.closed:
                    host.respond(rid, Ok(value=WaitCompleted(outcome=missing_cell(cell_id))))
                    return
                final: RuntimeResponse
                if cell.done:
                    final = Completed(cell_id=cell_id, content_items=self._take(cell))
                else:
                    # As the runtime does: a pending observer and the terminator get the same
                    # response.
                    final = Terminated(cell_id=cell_id, content_items=self._take(cell))
                    if cell.observer is not None:
                        self._respond(cell, final)
                host.respond(rid, Ok(value=WaitCompleted(outcome=LiveCell(response=final))))
                self._close(cell)
            case RequestReceived(request_id=rid):
                raise AssertionError(f"unexpected request {event}")
            case CancelRequested(request_id=rid):
                for cell in self.cells.values():
                    if cell.observer == rid:
                        cancelled = Err(kind=ErrorKind.CANCELLED, message="cancelled")
                        self._respond_raw(cell, cancelled)

    def emit(self, cell: FakeCell) -> None:
        if not cell.done and not cell.closed:
            item = f"{cell.cell_id}:{cell.emitted}"
            cell.emitted += 1
            cell.pending.append(item)
            self.emitted.append(item)

    def finish(self, cell: FakeCell) -> None:
        if not cell.done and not cell.closed:
            cell.done = True
            if cell.observer is not None:
                self.answer(cell)

    def answer(self, cell: FakeCell) -> None:
        """The cell's observer ends: its window, a yield, or the completion."""
        if cell.observer is None or cell.closed:
            return
        if cell.done:
            self._respond(cell, Completed(cell_id=cell.cell_id, content_items=self._take(cell)))
            self._close(cell)
        else:
            self._respond(cell, Yielded(cell_id=cell.cell_id, content_items=self._take(cell)))

    def _take(self, cell: FakeCell) -> list[ContentItem]:
        items: list[ContentItem] = [InputText(text=item) for item in cell.pending]
        cell.pending = []
        return items

    def _respond(self, cell: FakeCell, response: RuntimeResponse) -> None:
        if cell.observer_is_initial:
            self._respond_raw(cell, Ok(value=response))
        else:
            self._respond_raw(cell, Ok(value=WaitCompleted(outcome=LiveCell(response=response))))

    def _respond_raw(self, cell: FakeCell, result: object) -> None:
        assert cell.observer is not None
        if cell.observer_is_initial:
            self.pair.host.respond_initial(cell.observer, result)  # type: ignore[arg-type]
        else:
            self.pair.host.respond(cell.observer, result)  # type: ignore[arg-type]
        cell.observer = None

    def _close(self, cell: FakeCell) -> None:
        cell.closed = True
        self.pair.host.cell_closed(SESSION, cell.cell_id)


class User:
    """What the application sees: its cells, the observations it awaits, what it received."""

    def __init__(self, pair: Pair) -> None:
        self.pair = pair
        self.executes: set[int] = set()
        self.held: dict[str, int] = {}  # cell -> execute id, initial not taken nor released
        self.awaiting: dict[int, str] = {}  # observation or terminate id -> cell
        self.terminates: set[int] = set()  # never cancelled: the adapter shields them
        self.cancelled: set[int] = set()
        self.received: list[str] = []
        self.finished: set[str] = set()
        self.cells: list[str] = []
        self.unknown: set[str] = set()  # cells whose execute the user never saw answered

    def take(self, events: list[object], drop: Callable[[], bool] = lambda: False) -> None:
        for event in events:
            self.take_one(event, drop)

    def take_one(self, event: object, drop: Callable[[], bool] = lambda: False) -> None:
        """Receive an answer; `drop()` says its caller was cancelled just before it arrived
        (the adapter's slot refuses it and hands it back with `undelivered`, at once)."""
        match event:
            case Answered(request_id=rid, result=Ok(value=ExecutionStarted(cell_id=cell))):
                assert rid in self.executes
                self.executes.discard(rid)
                if drop():
                    self.pair.client.undelivered(rid, SESSION, event.result)
                    self.unknown.add(cell)
                    return
                self.cells.append(cell)
                self.held[cell] = rid
            case (
                Answered(request_id=rid, result=result)
                | InitialAnswered(request_id=rid, result=result)
            ):
                assert rid not in self.cancelled, f"an answer for retired request {rid}"
                awaited = self.awaiting.pop(rid, None)
                if awaited is None:
                    return  # an open's answer
                if rid not in self.terminates and drop():
                    self.cancelled.add(rid)
                    self.pair.client.undelivered(rid, SESSION, result)
                    return
                self._record(awaited, result)

    def _record(self, cell: str, result: object) -> None:
        if isinstance(result, Err):
            return
        value = result.value  # type: ignore[attr-defined]
        response = value.outcome.response if isinstance(value, WaitCompleted) else value
        if isinstance(value, WaitCompleted) and not isinstance(value.outcome, LiveCell):
            self.finished.add(cell)
            return
        if not isinstance(response, Yielded):
            if cell in self.finished:
                return  # the same end, told to an observer and to the terminator
            self.finished.add(cell)
        self.received += [
            item.text for item in response.content_items if isinstance(item, InputText)
        ]


def _pump(
    pair: Pair, runtime: FakeRuntime, user: User, drop: Callable[[], bool] = lambda: False
) -> None:
    for event in pair.to_host():
        runtime.handle(event)
    pair.to_client(lambda event: user.take_one(event, drop))


@settings(
    max_examples=int(__import__("os").environ.get("RETIREMENT_EXAMPLES", "300")), deadline=None
)
@given(data=st.data(), chunk=st.sampled_from([None, 1, 3, 7, 64]))
def test_no_output_is_lost_or_duplicated_whatever_is_cancelled(
    data: st.DataObject, chunk: int | None
) -> None:
    pair = Pair(chunk=chunk)
    pair.flush()
    pair.client.open_session(SESSION, None)
    runtime, user = FakeRuntime(pair), User(pair)
    for event in pair.to_host():
        assert isinstance(event, RequestReceived)
        pair.host.respond(event.request_id, Ok(value=SessionReady(session_id=SESSION)))
    user.take(pair.to_client())  # type: ignore[arg-type]

    steps = data.draw(st.lists(st.integers(0, 11), max_size=60))

    def drop() -> bool:
        return data.draw(st.integers(0, 5)) == 0

    for step in steps:
        cells = list(runtime.cells.values())
        if step == 0 and len(runtime.cells) < 4:
            rid = pair.client.execute(SESSION, ExecuteRequest(tool_call_id="c", source="x"))
            user.executes.add(rid)
        elif step in (1, 2) and cells:
            runtime.emit(data.draw(st.sampled_from(cells)))
        elif step == 3 and cells:
            runtime.answer(data.draw(st.sampled_from(cells)))
        elif step == 4 and cells:
            runtime.finish(data.draw(st.sampled_from(cells)))
        elif step == 5 and user.held:
            cell = data.draw(st.sampled_from(sorted(user.held)))
            rid = user.held.pop(cell)
            if data.draw(st.booleans()):
                pair.client.take_initial(rid)
                user.awaiting[rid] = cell
                user.take(pair.client_events_now())  # type: ignore[arg-type]
            else:
                pair.client.release_initial(rid)
        elif step == 6 and user.cells:
            cell = data.draw(st.sampled_from(user.cells))
            user.awaiting[pair.client.wait(SESSION, cell, 10)] = cell
            user.take(pair.client_events_now())  # type: ignore[arg-type]
        elif step == 7 and set(user.awaiting) - user.terminates:
            rid = data.draw(st.sampled_from(sorted(set(user.awaiting) - user.terminates)))
            del user.awaiting[rid]
            user.cancelled.add(rid)
            pair.client.cancel(rid)
        elif step == 8 and set(user.cells) - set(user.held):
            # (A terminate while the StartedCell still holds its initial response shares that
            # output with it, by design: `test_protocol_connections` covers that case.)
            cell = data.draw(st.sampled_from(sorted(set(user.cells) - set(user.held))))
            rid = pair.client.terminate(SESSION, cell)
            user.awaiting[rid] = cell
            user.terminates.add(rid)
            user.take(pair.client_events_now())  # type: ignore[arg-type]
        elif step == 9:
            for event in pair.to_host():
                runtime.handle(event)
        elif step == 10:
            pair.to_client(lambda event: user.take_one(event, drop))
        else:
            _pump(pair, runtime, user, drop)

    # Drain: every cell finishes, every held initial is released, then the user waits on
    # each cell until its end arrived.
    _pump(pair, runtime, user)
    for fake in list(runtime.cells.values()):
        runtime.finish(fake)
    for cell, rid in list(user.held.items()):
        pair.client.release_initial(rid)
        del user.held[cell]
    for _ in range(20):
        _pump(pair, runtime, user)
        observing = set(user.awaiting.values())
        for cell in user.cells:
            if cell not in user.finished and cell not in observing:
                user.awaiting[pair.client.wait(SESSION, cell, 10)] = cell
                user.take(pair.client_events_now())  # type: ignore[arg-type]
        _pump(pair, runtime, user)
        for fake in runtime.cells.values():
            runtime.answer(fake)
    _pump(pair, runtime, user)
    assert set(user.cells) <= user.finished
    # Every item exactly once, and each cell's items in the order it emitted them (but those of
    # the cells the user never learned of: they were terminated for it, by design).
    known = [item for item in runtime.emitted if item.split(":")[0] not in user.unknown]
    assert sorted(user.received) == sorted(known)
    for cell in user.cells:
        mine = [item for item in user.received if item.startswith(f"{cell}:")]
        assert mine == sorted(mine, key=lambda item: int(item.split(":")[1]))
    assert pair.client.statistics().observations == 0
