"""What the runtime tells the client about one cell's life, for its trace and its metrics.

The runtime records these few timestamps for a cell that asked for them (the application has a
recording tracer or meter); the in-process provider reads the report directly, a host sends it
in the cell's `cell/closed` frame under the trace-context capability (`docs/protocol.md`). The
report never holds the cell's source, arguments, results or output: only times, counts and
kinds. Times are `time.time_ns()` wall-clock nanoseconds, the clock OpenTelemetry stamps spans
with, so a host's spans line up with the client's on one machine and within the clocks' skew
across machines.
"""

from __future__ import annotations

import msgspec


class TraceContext(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    """A W3C trace context (https://www.w3.org/TR/trace-context/) as it travels in a frame.

    Parameters:
        traceparent: `00-<trace id>-<parent span id>-<flags>`.
        tracestate: the vendors' state, when there is one.
    """

    traceparent: str
    tracestate: str | None = None


class CellReport(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    """One cell's life as its runtime saw it.

    Parameters:
        outcome: how it ended: `completed`, `error`, `terminated`, `shutdown`, `cpu_limit`,
            `time_limit`, `heap_limit`, `output_limit` (`docs/observability.md`).
        error_type: the class of the JavaScript error that ended it (`TypeError`), never
            its message; None when no error ended it.
        admitted_ns: when the runtime admitted it.
        started_ns: when its JavaScript began (its engine runtime and globals were made), or 0
            if it never did.
        finished_ns: when its JavaScript ended, or 0 if it never did.
        closed_ns: when the cell closed.
        setup_ns: nanoseconds its worker spent making its engine runtime.
        turns: the JavaScript turns it ran.
        cpu_ms: the CPU time its turns used.
        heap_bytes: the JavaScript heap it held when its JavaScript ended.
        output_bytes: the bytes of output it produced.
        yields_ns: when it called `yield_control()`.
        tool_call_ns: each answered tool call's round trip as the runtime saw it, in
            nanoseconds, in answer order.
    """

    outcome: str
    admitted_ns: int
    error_type: str | None = None
    started_ns: int = 0
    finished_ns: int = 0
    closed_ns: int = 0
    setup_ns: int = 0
    turns: int = 0
    cpu_ms: float = 0.0
    heap_bytes: int = 0
    output_bytes: int = 0
    yields_ns: list[int] = msgspec.field(default_factory=list)
    tool_call_ns: list[int] = msgspec.field(default_factory=list)


def error_type(error_text: str) -> str:
    """The JavaScript error's class from a cell's error text (`TypeError: x` -> `TypeError`),
    never its message; `Error` when the text names none."""
    head = error_text.partition(":")[0].strip()
    return head if head.isidentifier() else "Error"
