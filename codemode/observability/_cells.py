"""A traced cell on the application's side: its span, its observations, its nested calls.

Every provider's session does the same four things for a cell, and only when `lookup()` found
something that records (`_telemetry`):
1. `SessionTraces.begin` opens the cell's span `code_mode.cell` in the context current at
   `execute`, and wraps the application's delegate in the `CellTrace`, so each tool call is a
   child span `code_mode.tool_call` with that span's context current while the application's
   `invoke_tool` runs (its own spans nest under it, also for a call made after the cell
   yielded), and each `notify` is an event of the cell span.
2. `started` names the cell once its id is known; `refused` ends the span of an execute that
   failed.
3. `CellTrace.observe` wraps each observation (the initial response, `wait`,
   `wait_to_pending`, `execute_to_pending`, `terminate`) in a child span `code_mode.observe`.
4. The runtime's `CellReport` (`cell_report`, just before `cell_closed`) and the cell's last
   response give the span its outcome and figures; `cell_closed` ends it: every cell span
   ends exactly once, also when the host is lost (outcome `host_lost`).
The in-process provider's runtime shares the application's process: its `code_mode.host.*`
spans come from the report here (`_host_spans`); a host process makes its own.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec

from .._api import (
    Completed,
    ContentItem,
    ExecuteRequest,
    InputText,
    JsonValue,
    LiveCell,
    MissingCell,
    NestedToolCall,
    Pending,
    SessionDelegate,
    Terminated,
    Yielded,
)
from ..errors import CodeModeError, ToolDeniedError, ToolError, error_kind
from . import _settings, _telemetry
from ._host_spans import emit_host_spans
from ._logs import current_cell, install_log_filter
from ._report import CellReport, TraceContext, error_type
from ._telemetry import Telemetry, inject, lookup

_T = TypeVar("_T")


def _bytes_of(items: list[ContentItem]) -> int:
    return sum(
        len(item.text.encode()) if isinstance(item, InputText) else len(item.image_url)
        for item in items
    )


def _json_text(value: JsonValue) -> str:
    try:
        return msgspec.json.encode(value).decode()
    except (TypeError, ValueError, OverflowError):
        return repr(value)


class CellTrace:
    """One traced cell: its span and the delegate that wraps the application's
    (implements `SessionDelegate`)."""

    def __init__(
        self,
        telemetry: Telemetry,
        traces: SessionTraces,
        request: ExecuteRequest,
        delegate: SessionDelegate,
        session_id: str,
    ) -> None:
        self._telemetry = telemetry
        self._traces = traces
        self._delegate = delegate
        self._session_id = session_id
        self._began = time.monotonic()
        self.cell_id = ""
        attributes: dict[str, Any] = {
            "session.id": session_id,
            "codemode.provider": traces.provider,
            "codemode.exec.call_id": request.tool_call_id,
            "codemode.cell.tools": len(request.enabled_tools),
        }
        settings = _settings.current()
        if settings.record_source:
            attributes["codemode.cell.source"] = _settings.clipped(request.source)
        self.span = telemetry.tracer.start_span("code_mode.cell", attributes=attributes)
        self.context = _telemetry.trace.set_span_in_context(self.span)
        self._tool_calls = 0
        self._observations = 0
        self._first_response = True
        self._last: Completed | Terminated | None = None
        self._report: CellReport | None = None
        self.closed = False
        install_log_filter()

    # ---- the cell's course ---------------------------------------------------------------

    def started(self, cell_id: str, generation: int) -> None:
        self.cell_id = cell_id
        self.span.set_attribute("codemode.cell.id", cell_id)
        self.span.set_attribute("codemode.cell.generation", generation)
        self._telemetry.cells_started.add(1, {"codemode.provider": self._traces.provider})
        self._telemetry.cells_active.add(1, {"codemode.provider": self._traces.provider})

    def refused(self, error: BaseException) -> None:
        """The execute failed before a cell existed: the span ends with its error's type."""
        self.closed = True
        kind = error_kind(error).value if isinstance(error, CodeModeError) else None
        self.span.set_attribute("codemode.cell.outcome", "refused")
        self.span.set_attribute("error.type", type(error).__qualname__)
        self.span.set_status(_telemetry.trace.StatusCode.ERROR)
        self.span.end()
        if kind is not None and kind in ("admission", "too_many_requests"):
            self._telemetry.refusals.add(1, {"codemode.error.kind": kind})

    def trace_context(self) -> TraceContext:
        """The W3C trace context of the cell's span, for the execute frame."""
        return inject(self.context)

    async def observe(
        self,
        kind: str,
        operation: Callable[[TraceContext | None], Awaitable[_T]],
        *,
        propagate: bool = False,
    ) -> _T:
        """Run an observation of the cell inside its `code_mode.observe` span: `operation`
        gets the span's trace context with `propagate` (for a host to parent its own spans
        on), else None."""
        span = self._telemetry.tracer.start_span(
            "code_mode.observe", context=self.context, attributes={"codemode.observe.kind": kind}
        )
        self._observations += 1
        token = current_cell.set((self._session_id, self.cell_id))
        try:
            context = _telemetry.trace.set_span_in_context(span) if propagate else None
            result = await operation(None if context is None else inject(context))
        except BaseException as error:
            cancelled = type(error).__name__ == "Cancelled"
            span.set_attribute("codemode.observe.outcome", "cancelled" if cancelled else "error")
            if not cancelled:
                span.set_attribute("error.type", type(error).__qualname__)
                span.set_status(_telemetry.trace.StatusCode.ERROR)
            raise
        else:
            self._observed(span, result)
            return result
        finally:
            current_cell.reset(token)
            span.end()

    def _observed(self, span: Any, result: object) -> None:
        if self._first_response:
            self._first_response = False
            self._telemetry.first_response.record(time.monotonic() - self._began)
        response = result.response if isinstance(result, LiveCell | MissingCell) else result
        if isinstance(result, MissingCell):
            outcome = "missing"
        elif isinstance(response, Yielded):
            outcome = "yielded"
        elif isinstance(response, Pending):
            outcome = "pending"
        elif isinstance(response, Terminated):
            outcome = "terminated"
            self._last = response
        else:
            assert isinstance(response, Completed)
            outcome = "completed"
            self._last = response
        span.set_attribute("codemode.observe.outcome", outcome)
        if isinstance(response, Yielded | Pending | Terminated | Completed):
            span.set_attribute("codemode.observe.bytes", _bytes_of(response.content_items))

    def cell_report(self, report: CellReport) -> None:
        """The runtime's account of the cell, just before `cell_closed`."""
        self._report = report

    def _end(self) -> None:
        span = self.span
        report = self._report
        outcome = report.outcome if report is not None else self._outcome_without_report()
        span.set_attribute("codemode.cell.outcome", outcome)
        span.set_attribute("codemode.cell.tool_calls", self._tool_calls)
        span.set_attribute("codemode.cell.observations", self._observations)
        last = self._last
        if report is not None and report.error_type is not None:
            span.set_attribute("error.type", report.error_type)
        elif isinstance(last, Completed) and last.error_text is not None:
            span.set_attribute("error.type", error_type(last.error_text))
        elif outcome not in ("completed", "terminated", "shutdown"):
            span.set_attribute("error.type", outcome)
        if outcome not in ("completed", "terminated", "shutdown"):
            span.set_status(_telemetry.trace.StatusCode.ERROR)
        provider = self._traces.provider
        telemetry = self._telemetry
        if report is not None:
            span.set_attribute("codemode.cell.cpu_ms", report.cpu_ms)
            span.set_attribute("codemode.cell.heap_bytes", report.heap_bytes)
            span.set_attribute("codemode.cell.output_bytes", report.output_bytes)
            span.set_attribute("codemode.cell.turns", report.turns)
            if report.started_ns:
                span.set_attribute(
                    "codemode.host.start_ms", (report.started_ns - report.admitted_ns) / 1e6
                )
            span.set_attribute("codemode.host.setup_ms", report.setup_ns / 1e6)
            for stamp in report.yields_ns:
                span.add_event("yield_control", timestamp=stamp)
            telemetry.cell_cpu.record(report.cpu_ms, {"codemode.provider": provider})
            if self._traces.local_runtime:
                emit_host_spans(telemetry, report, self.context)
                for round_trip in report.tool_call_ns:
                    telemetry.host_tool_call_duration.record(round_trip / 1e9)
        labels = {"codemode.provider": provider, "codemode.cell.outcome": outcome}
        telemetry.cells_ended.add(1, labels)
        telemetry.cells_active.add(-1, {"codemode.provider": provider})
        telemetry.cell_duration.record(time.monotonic() - self._began, labels)
        span.end()

    def _outcome_without_report(self) -> str:
        last = self._last
        if isinstance(last, Terminated):
            return "terminated"
        if isinstance(last, Completed):
            return "completed" if last.error_text is None else "error"
        return "host_lost"  # closed with no report and no end seen: its runtime went away

    # ---- SessionDelegate -----------------------------------------------------------------

    async def invoke_tool(self, call: NestedToolCall) -> JsonValue:
        telemetry = self._telemetry
        self._tool_calls += 1
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.tool_name.name,
            "gen_ai.tool.call.id": call.runtime_tool_call_id,
            "codemode.cell.id": call.cell_id,
        }
        if call.tool_name.namespace is not None:
            attributes["codemode.tool.namespace"] = call.tool_name.namespace
        settings = _settings.current()
        if settings.record_payloads:
            attributes["codemode.tool_call.arguments"] = _settings.clipped(_json_text(call.input))
        span = telemetry.tracer.start_span(
            "code_mode.tool_call", context=self.context, attributes=attributes
        )
        began = time.monotonic()
        telemetry.tool_calls_pending.add(1)
        token = _attach(_telemetry.trace.set_span_in_context(span, self.context))
        cell = current_cell.set((self._session_id, call.cell_id))
        outcome = "error"
        try:
            result = await self._delegate.invoke_tool(call)
        except ToolDeniedError:
            outcome = "denied"
            span.set_attribute("error.type", "ToolDeniedError")
            raise
        except ToolError:
            outcome = "tool_error"
            span.set_attribute("error.type", "ToolError")
            span.set_status(_telemetry.trace.StatusCode.ERROR)
            raise
        except BaseException as error:
            if type(error).__name__ == "Cancelled":
                outcome = "cancelled"
            else:
                span.set_attribute("error.type", type(error).__qualname__)
                span.set_status(_telemetry.trace.StatusCode.ERROR)
            raise
        else:
            outcome = "ok"
            if settings.record_payloads:
                span.set_attribute(
                    "codemode.tool_call.result", _settings.clipped(_json_text(result))
                )
            return result
        finally:
            current_cell.reset(cell)
            _detach(token)
            span.set_attribute("codemode.tool_call.outcome", outcome)
            telemetry.tool_calls_pending.add(-1)
            telemetry.tool_call_duration.record(
                time.monotonic() - began, {"codemode.tool_call.outcome": outcome}
            )
            span.end()

    async def notify(self, call_id: str, cell_id: str, text: str) -> None:
        attributes: dict[str, Any] = {"codemode.notify.bytes": len(text.encode())}
        if _settings.current().record_payloads:
            attributes["codemode.notify.text"] = _settings.clipped(text)
        self.span.add_event("notify", attributes)
        token = _attach(self.context)
        cell = current_cell.set((self._session_id, cell_id))
        try:
            await self._delegate.notify(call_id, cell_id, text)
        finally:
            current_cell.reset(cell)
            _detach(token)

    def cell_closed(self, cell_id: str) -> None:
        self.cell_id = self.cell_id or cell_id
        if not self.closed:
            self.closed = True
            self._traces.forget(self)
            self._end()
        cell = current_cell.set((self._session_id, cell_id))
        try:
            self._delegate.cell_closed(cell_id)
        finally:
            current_cell.reset(cell)


def _attach(context: Any) -> object:
    from opentelemetry import context as otel_context

    return otel_context.attach(context)


def _detach(token: object) -> None:
    from opentelemetry import context as otel_context

    otel_context.detach(token)  # type: ignore[arg-type]


class SessionTraces:
    """One session's traced cells, by public cell id.

    Args:
        provider: the provider's kind (`in_process`, `process`, `remote`, `ray`), an
            attribute of every cell span.
        local_runtime: the runtime shares this process (in-process): the cell's
            `code_mode.host.*` spans and host-side metrics are made here from its report.
    """

    def __init__(self, provider: str, *, local_runtime: bool = False) -> None:
        self.provider = provider
        self.local_runtime = local_runtime
        self._cells: dict[str, CellTrace] = {}

    def begin(
        self, request: ExecuteRequest, delegate: SessionDelegate, session_id: str
    ) -> CellTrace | None:
        """The trace of a cell about to be executed, or None when nothing records."""
        telemetry = lookup()
        if telemetry is None:
            return None
        return CellTrace(telemetry, self, request, delegate, session_id)

    def started(self, cell: CellTrace, cell_id: str, generation: int = 1) -> None:
        cell.started(cell_id, generation)
        if not cell.closed:  # an execute_to_pending's cell may have closed already
            self._cells[cell_id] = cell

    def get(self, cell_id: str) -> CellTrace | None:
        """The trace of a live cell, if it is traced."""
        return self._cells.get(cell_id) if self._cells else None

    def forget(self, cell: CellTrace) -> None:
        if self._cells.get(cell.cell_id) is cell:
            del self._cells[cell.cell_id]

    def host_replaced(self) -> None:
        """The session was re-opened on a new host (`codemode.host.generations`)."""
        telemetry = lookup()
        if telemetry is not None:
            telemetry.generations.add(1, {"codemode.provider": self.provider})
