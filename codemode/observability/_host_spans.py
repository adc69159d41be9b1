"""The runtime's side of a cell as spans `code_mode.host.*`, made from its `CellReport`.

The runtime stamps a cell's life as it goes (`CellReport`) and the spans are made once, when
the cell closes, with those stamps as their times: nothing in the runtime's hot path touches
OpenTelemetry. A host process makes them under the trace context its execute frame carried
(`codemode-host --otel`); the in-process provider, whose runtime shares the application's
process, makes them under the cell's span.

    code_mode.host.cell          admitted -> closed
      code_mode.host.start       admitted -> its JavaScript began (engine runtime and globals)
      code_mode.host.javascript  began -> ended (its turns, its CPU time)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ._report import CellReport, TraceContext
from ._telemetry import Telemetry, extract, lookup


def emit_host_spans(telemetry: Telemetry, report: CellReport, parent: Any) -> None:
    """Make the host spans of one cell under `parent` (an OpenTelemetry context)."""
    tracer = telemetry.tracer
    cell = tracer.start_span(
        "code_mode.host.cell",
        context=parent,
        start_time=report.admitted_ns,
        attributes={
            "codemode.cell.outcome": report.outcome,
            "codemode.cell.turns": report.turns,
            "codemode.cell.cpu_ms": report.cpu_ms,
            "codemode.cell.heap_bytes": report.heap_bytes,
            "codemode.cell.output_bytes": report.output_bytes,
            "codemode.cell.tool_calls": len(report.tool_call_ns),
        },
    )
    from opentelemetry import trace

    inside = trace.set_span_in_context(cell, parent)
    if report.started_ns:
        start = tracer.start_span(
            "code_mode.host.start",
            context=inside,
            start_time=report.admitted_ns,
            attributes={"codemode.host.setup_ms": report.setup_ns / 1e6},
        )
        start.end(end_time=report.started_ns)
        ended = report.finished_ns or report.closed_ns
        javascript = tracer.start_span(
            "code_mode.host.javascript",
            context=inside,
            start_time=report.started_ns,
            attributes={"codemode.cell.turns": report.turns, "codemode.cell.cpu_ms": report.cpu_ms},
        )
        for stamp in report.yields_ns:
            javascript.add_event("yield_control", timestamp=stamp)
        javascript.end(end_time=max(ended, report.started_ns))
    cell.end(end_time=max(report.closed_ns, report.admitted_ns))


def record_host_metrics(telemetry: Telemetry, report: CellReport) -> None:
    """A host's own metrics of one closed cell (`codemode-host --otel`)."""
    telemetry.cells_ended.add(1, {"codemode.cell.outcome": report.outcome})
    telemetry.cell_cpu.record(report.cpu_ms)
    for round_trip in report.tool_call_ns:
        telemetry.host_tool_call_duration.record(round_trip / 1e9)


@contextmanager
def host_observation(trace_context: TraceContext | None, kind: str) -> Iterator[None]:
    """A host's span `code_mode.host.observe` around one observation a traced client asked
    for, when the host reports to OpenTelemetry (`codemode-host --otel`)."""
    telemetry = lookup() if trace_context is not None else None
    if telemetry is None or trace_context is None:
        yield
        return
    span = telemetry.tracer.start_span(
        "code_mode.host.observe",
        context=extract(trace_context),
        attributes={"codemode.observe.kind": kind},
    )
    try:
        yield
    finally:
        span.end()
