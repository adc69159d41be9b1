"""The model layer's spans: `code_mode.exec` and `code_mode.wait`, one per model tool call.

The cell's span (`code_mode.cell`) nests under the `code_mode.exec` that started it, since that
span is current while the layer calls `execute`. They carry what the model asked for (the
pragma's window and token budget, the `wait` arguments) and what it got back (the status, the
budget applied and whether output was truncated), never the source or the output.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from . import _telemetry


class ModelSpan:
    """A model tool call's span, or nothing when no tracer records (every method a no-op)."""

    __slots__ = ("_span",)

    def __init__(self, span: Any = None) -> None:
        self._span = span

    @property
    def recording(self) -> bool:
        return self._span is not None

    def set(self, key: str, value: str | int | float | bool | None) -> None:
        if self._span is not None and value is not None:
            self._span.set_attribute(key, value)


_NOTHING = ModelSpan()


@contextmanager
def model_span(name: str, call_id: str | None) -> Iterator[ModelSpan]:
    """The span of one `exec` or `wait` call, current for its duration."""
    telemetry = _telemetry.lookup()
    if telemetry is None:
        yield _NOTHING
        return
    attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name[10:]}
    if call_id is not None:
        attributes["gen_ai.tool.call.id"] = call_id
    with telemetry.tracer.start_as_current_span(
        name, attributes=attributes, record_exception=False, set_status_on_exception=False
    ) as span:
        try:
            yield ModelSpan(span)
        except BaseException as error:
            if type(error).__name__ != "Cancelled":
                span.set_attribute("error.type", type(error).__qualname__)
                span.set_status(_telemetry.trace.StatusCode.ERROR)
            raise
