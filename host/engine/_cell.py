"""One cell's handle on the trio side: its events, and the commands it answers with.

A cell's task loops on `await cell.next_events()`, or hands its events to a handler with
`await cell.handle_until_finished(handle)`, and answers with the non-blocking
`settle_tool_call`, `reject_tool_call`, `fire_timer` and `interrupt` (design.md, design 2,
"Engine threads"): no thread hand-off per JavaScript turn.

`handle_until_finished` runs the handler in the engine collector's task while the cell's task
waits, so that an event costs no pass of the scheduler to reach the cell (a tool call leaves for
its delegate in the step that drained it, a completion for its observer); only `Finished`,
handled too, wakes the task. An exception of the handler is raised in that task, never in the
collector, which serves every cell. `stop_handling()` ends the wait without a `Finished` (a
terminated turn that does not stop is abandoned). `handle_events` hands the events over the
same way with no task waiting at all (a task may take over with `handle_until_finished`): the
runtime's cells have a task only when they must wait themselves.

Resource handling: each `EngineCell` owns a QuickJS runtime until `close()` (or the end of a
`with` block).
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType

import trio

from .. import _quickjs
from ._events import CellEvent, Finished

# How `settle_tool` settles a call (the extension's `enum settle_kind`).
_SETTLE_REJECT = 0
_SETTLE_JSON = 1
_SETTLE_TEXT = 2
_SETTLE_REJECT_ERROR = 3


class EngineCell:
    """One running cell: submit work to it, collect its events.

    Only `Engine.start_cell` creates these. Every method returns at once; the work runs on
    an engine worker. After `Finished` the cell ignores further work; after `close()` its
    methods raise `EngineClosedError`.
    """

    def __init__(self, native: _quickjs.Cell, forget: Callable[[int], None]) -> None:
        self._native = native
        self._forget = forget  # the engine's: it dispatches to this cell no more
        self._pending: list[CellEvent] = []
        self._wakeup: trio.Event | None = None
        self._handle: Callable[[CellEvent], None] | None = None
        self._failure: Exception | None = None
        self._failed: Callable[[], None] | None = None
        self._finished: Finished | None = None
        self._stopped = False
        key = native.key
        assert key is not None, "a fresh cell always has its key"
        self.key: int = key
        self.commands_submitted = 1
        """Start, settle and fire-timer commands submitted so far (the start included): an
        `Idle` event whose `commands_taken` equals it reports a quiescent cell."""

    def _deliver(self, event: CellEvent) -> None:
        handle = self._handle
        if handle is None:
            self._pending.append(event)
        else:
            try:
                handle(event)
            except Exception as error:
                self._failure = error  # raised by `handle_until_finished`; nothing more handled
                failed, self._handle, self._failed = self._failed, None, None
                if failed is not None:
                    failed()
            else:
                if not isinstance(event, Finished):
                    return
                self._handle = self._failed = None  # handled: `handle_until_finished` returns it
                self._finished = event
        if self._wakeup is not None:
            self._wakeup.set()

    def handle_events(
        self, handle: Callable[[CellEvent], None], failed: Callable[[], None]
    ) -> None:
        """Hand every event to `handle` in the collector's step, with no task waiting, until
        `Finished`, which is handled too. If `handle` raises, it is given nothing more and
        `failed()` is called (it must not block nor raise); `handle_until_finished(handle)`,
        which may take the handling over at any time, then raises the exception."""
        self._failed = failed
        self._take_handling(handle)

    def _take_handling(self, handle: Callable[[CellEvent], None]) -> None:
        self._handle = handle  # from now on, every event reaches it in the collector
        events, self._pending = self._pending, []
        for event in events:  # published before the handler was set: handled here
            self._deliver(event)

    def stop_handling(self) -> None:
        """`handle_until_finished` returns None now, or as soon as it is called, unless the
        `Finished` was handled first; the events that follow wait in the cell."""
        self._stopped = True
        if self._wakeup is not None:
            self._wakeup.set()

    async def handle_until_finished(self, handle: Callable[[CellEvent], None]) -> Finished | None:
        """Hand every event to `handle` (in the collector's task while this one waits) until
        `Finished`, which is handled too and returned (None: `stop_handling()` came first); an
        exception of `handle` is raised here. Takes over from `handle_events(handle, ...)`:
        what that handled is not handled again."""
        self._failed = None  # a task waits: it raises the failure itself
        if self._handle is None and not self._ended():
            self._take_handling(handle)
        # `_ended()`, not the attributes tested inline: the collector sets them while this
        # waits, and a compiled module (docs/compiled.md) would trust a test made before.
        if not self._ended():
            try:
                while not self._ended() and not self._stopped:
                    self._wakeup = trio.Event()
                    await self._wakeup.wait()
                    self._wakeup = None
            finally:
                self._handle = None
        else:
            await trio.lowlevel.checkpoint()
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure
        return self._finished  # None: stopped

    def _ended(self) -> bool:
        """`Finished` was handled, or handling failed."""
        return self._finished is not None or self._failure is not None

    async def next_events(self) -> list[CellEvent]:
        """Wait until the cell has published something; return everything it has published."""
        if self._pending:
            # A checkpoint even when events are waiting: a cell that floods events (an output
            # loop) must not keep its observers from running.
            await trio.lowlevel.checkpoint()
        while not self._pending:
            # Waiting is the checkpoint: one more after it would cost every batch a pass.
            self._wakeup = trio.Event()
            await self._wakeup.wait()
            self._wakeup = None
        events, self._pending = self._pending, []
        return events

    def settle_tool_call(self, call_id: int, result_json: bytes) -> None:
        """Resolve the promise of tool call `call_id` with the value of `result_json`."""
        self._native.settle_tool(call_id, _SETTLE_JSON, result_json)
        self.commands_submitted += 1

    def settle_tool_call_with_text(self, call_id: int, text_utf8: bytes) -> None:
        """Resolve the promise of tool call `call_id` with the string whose UTF-8 is
        `text_utf8`, as `settle_tool_call` with its JSON would, without the JSON (a large
        string result costs a copy instead of an escaping pass and a parse)."""
        self._native.settle_tool(call_id, _SETTLE_TEXT, text_utf8)
        self.commands_submitted += 1

    def reject_tool_call_with_error(self, call_id: int, message: str) -> None:
        """Reject the promise of tool call `call_id` with an `Error` whose message is
        `message` (a denied call: docs/governance.md), encoded as `reject_tool_call`'s text."""
        self._native.settle_tool(
            call_id, _SETTLE_REJECT_ERROR, message.encode(errors="surrogatepass")
        )
        self.commands_submitted += 1

    def reject_tool_call(self, call_id: int, error_text: str) -> None:
        """Reject the promise of tool call `call_id` with the plain string `error_text`. Encoded
        as a cell's source is (`surrogatepass`): an error text comes from any exception's
        message, and a lone surrogate in it reaches the cell as one."""
        self._native.settle_tool(call_id, _SETTLE_REJECT, error_text.encode(errors="surrogatepass"))
        self.commands_submitted += 1

    def output_taken(self, size: int) -> None:
        """The runtime took `size` bytes of the cell's output: room under its output limit."""
        self._native.output_taken(size)

    def fire_timer(self, timer_id: int) -> None:
        """Run the callback of timer `timer_id`, unless it was cleared."""
        self._native.fire_timer(timer_id)
        self.commands_submitted += 1

    def interrupt(self) -> None:
        """Stop the cell's JavaScript, running or idle; it then reports `Outcome.INTERRUPTED`."""
        self._native.interrupt()

    def close(self) -> None:
        """Interrupt the cell if needed and free its runtime. Idempotent."""
        self._handle = self._failed = None  # the handler's owner holds this cell: no cycle
        self._forget(self.key)
        self._native.close()

    def __enter__(self) -> EngineCell:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
