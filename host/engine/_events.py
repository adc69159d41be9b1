"""The events a cell publishes while it runs, as the engine hands them to the runtime.

Each event is a frozen `msgspec.Struct`; `decode_event` turns one raw tuple of the C extension
into one of them. Events of one cell arrive in the order the cell made them. A cell publishes
`Started` once its globals are installed (before its source is compiled), `Idle` at the end of
every turn, and `Finished` last, exactly once, unless it is closed first.
"""

from __future__ import annotations

import enum
from typing import Final, TypeAlias

import msgspec

from .. import _quickjs


class Outcome(enum.Enum):
    """How a cell's JavaScript ended."""

    OK = _quickjs.OUTCOME_OK
    """The module promise fulfilled, or the cell called `exit()`."""
    ERROR = _quickjs.OUTCOME_ERROR
    """The module promise rejected, or a timer callback or the cell's set-up threw."""
    INTERRUPTED = _quickjs.OUTCOME_INTERRUPTED
    """`interrupt()` or `close()` stopped it; never reported as a JS error."""
    CPU_LIMIT = _quickjs.OUTCOME_CPU_LIMIT
    """It used up its CPU time limit (`error_text` says so); uncatchable by the cell."""


class Started(msgspec.Struct, frozen=True):
    """The cell's runtime and globals exist; its source is about to be evaluated.

    Parameters:
        setup_ns: nanoseconds the worker spent creating the runtime, the context and the
            globals (telemetry; the benchmarks report it).
    """

    setup_ns: int = 0


class TextOutput(msgspec.Struct, frozen=True):
    """`text(value)` (or the hint of `generatedImage`) appended an output item."""

    text: str


class ImageOutput(msgspec.Struct, frozen=True):
    """`image(...)` or `generatedImage(...)` appended an image item; `detail` is explicit."""

    image_url: str
    detail: str


class Notification(msgspec.Struct, frozen=True):
    """`notify(value)`: text for the host, out of band."""

    text: str


class ToolCallRequested(msgspec.Struct, frozen=True):
    """`tools.<name>(input)`: the cell awaits `settle_tool_call` or `reject_tool_call`.

    Parameters:
        call_id: counted per cell from 1; the reference calls it `tool-<call_id>`.
        tool_index: index into the tools the cell was started with.
        input_json: JSON text of the first argument, or None when there was none or its
            JSON form is `undefined`.
    """

    call_id: int
    tool_index: int
    input_json: bytes | None


class StoredValueWritten(msgspec.Struct, frozen=True):
    """`store(key, value)`: the value as JSON text."""

    key: str
    value_json: bytes


class YieldRequested(msgspec.Struct, frozen=True):
    """`yield_control()`."""


class TimerStarted(msgspec.Struct, frozen=True):
    """`setTimeout(...)`: call `fire_timer(timer_id)` after `delay_ms` milliseconds."""

    timer_id: int
    delay_ms: int


class TimerCleared(msgspec.Struct, frozen=True):
    """`clearTimeout(timer_id)` removed a pending timer; firing it now would do nothing."""

    timer_id: int


class Idle(msgspec.Struct, frozen=True):
    """A turn ended with the cell still running.

    Parameters:
        commands_taken: how many start, settle and fire-timer commands the cell has run so
            far; equal to what was submitted (`EngineCell.commands_submitted`) means the cell is
            quiescent: nothing it was given is left to run.
        cpu_us: CPU time the cell's turns have used so far, in microseconds.
    """

    commands_taken: int
    cpu_us: int = 0


class Finished(msgspec.Struct, frozen=True):
    """The cell's JavaScript is over; `error_text` is set exactly when the outcome is ERROR or
    CPU_LIMIT; `heap_bytes`: the JavaScript heap the cell held then (telemetry); `cpu_us`: the
    CPU time all its turns used, the last one included (a cell that ends in its first turn
    publishes no `Idle`)."""

    outcome: Outcome
    error_text: str | None
    heap_bytes: int = 0
    cpu_us: int = 0


CellEvent = (
    Started
    | TextOutput
    | ImageOutput
    | Notification
    | ToolCallRequested
    | StoredValueWritten
    | YieldRequested
    | TimerStarted
    | TimerCleared
    | Idle
    | Finished
)


_OUTCOMES: Final = {outcome.value: outcome for outcome in Outcome}
"""`Outcome(n)` without the Enum's Python-level call (once a cell)."""
_CPU_SHIFT: Final = _quickjs.FINISHED_CPU_SHIFT
_OUTCOME_MASK: Final = (1 << _CPU_SHIFT) - 1
"""`EV_FINISHED` carries the outcome in these bits of `n1`, the CPU microseconds above."""
_ERROR: Final = Outcome.ERROR

# The kinds of raw event, as `Final` names: C statics in the compiled build, where reading
# `_quickjs.EV_FINISHED` is a lookup of the module and of its attribute (about 300 instructions),
# and a cell's `Finished` was tested after ten others.
_EV_IDLE: Final = _quickjs.EV_IDLE
_EV_STARTED: Final = _quickjs.EV_STARTED
_EV_TEXT: Final = _quickjs.EV_TEXT
_EV_TOOL_CALL: Final = _quickjs.EV_TOOL_CALL
_EV_FINISHED: Final = _quickjs.EV_FINISHED
_EV_IMAGE: Final = _quickjs.EV_IMAGE
_EV_NOTIFY: Final = _quickjs.EV_NOTIFY
_EV_STORE: Final = _quickjs.EV_STORE
_EV_YIELD: Final = _quickjs.EV_YIELD
_EV_TIMER_SET: Final = _quickjs.EV_TIMER_SET
_EV_TIMER_CLEAR: Final = _quickjs.EV_TIMER_CLEAR


RawEvent: TypeAlias = tuple[int, int, int, int, str | bytes | None, str | bytes | None]
"""One event as `_quickjs.Engine.drain()` returns it: the cell's key, the kind (`EV_*`) and the
fields `decode_event` reads. A name for typing only: the extension has no such object."""


def decode_event(
    kind: int, n1: int, n2: int, a: str | bytes | None, b: str | bytes | None
) -> CellEvent:
    """Build the typed event from the fields of one raw event of the extension."""
    # The kinds of every cell first (`_EV_IDLE`, above).
    if kind == _EV_IDLE:
        return Idle(n1, n2)
    if kind == _EV_STARTED:
        return Started(n1)
    if kind == _EV_TEXT:
        assert isinstance(a, str)
        return TextOutput(a)
    if kind == _EV_TOOL_CALL:
        assert a is None or isinstance(a, bytes)
        return ToolCallRequested(n1, n2, a)
    if kind == _EV_FINISHED:
        assert a is None or isinstance(a, str)
        outcome = _OUTCOMES[n1 & _OUTCOME_MASK]
        if outcome is _ERROR and a is None:
            a = "InternalError: out of memory"  # the error text itself could not be made
        return Finished(outcome, a, n2, n1 >> _CPU_SHIFT)
    if kind == _EV_IMAGE:
        assert isinstance(a, str)
        assert isinstance(b, str)
        return ImageOutput(a, b)
    if kind == _EV_NOTIFY:
        assert isinstance(a, str)
        return Notification(a)
    if kind == _EV_STORE:
        assert isinstance(a, str)
        assert isinstance(b, bytes)
        return StoredValueWritten(a, b)
    if kind == _EV_YIELD:
        return YieldRequested()
    if kind == _EV_TIMER_SET:
        return TimerStarted(n1, n2)
    if kind == _EV_TIMER_CLEAR:
        return TimerCleared(n1)
    raise ValueError(f"unknown engine event kind {kind}")
