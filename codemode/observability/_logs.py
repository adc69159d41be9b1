"""Log records that join the trace: the cell id, session id and trace id on codemode's records.

While codemode works for a traced cell (its tool calls, notifications, observations and its
close) the cell is named in a context variable; `CellLogFilter` copies it, and the trace id of
the current OpenTelemetry span, onto every record of a `codemode` logger as
`codemode_cell_id`, `codemode_session_id` and `otel_trace_id` (None outside a cell's work), so
a formatter can print them (`%(codemode_cell_id)s`) and a log pipeline can join the trace.
"""

from __future__ import annotations

import contextvars
import logging

from . import _telemetry

current_cell: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "codemode_current_cell", default=None
)
"""(session id, cell id) of the cell whose work runs in this context, if any."""


class CellLogFilter(logging.Filter):
    """Adds `codemode_cell_id`, `codemode_session_id` and `otel_trace_id` to each record."""

    def filter(self, record: logging.LogRecord) -> bool:
        cell = current_cell.get()
        record.codemode_session_id, record.codemode_cell_id = cell or (None, None)
        record.otel_trace_id = None
        trace = _telemetry.trace
        if trace is not None:
            context = trace.get_current_span().get_span_context()
            if context.is_valid:
                record.otel_trace_id = f"{context.trace_id:032x}"
        return True


_FILTER = CellLogFilter()
_installed_over = -1
"""How many loggers existed when the filter was last installed."""


def install_log_filter() -> None:
    """Put `CellLogFilter` on every `codemode` logger that exists (idempotent). A logger's
    filters see only its own records, so each named logger gets it (`tests/test_observability.py`
    checks that every logger codemode makes is covered)."""
    global _installed_over
    loggers = logging.root.manager.loggerDict
    if len(loggers) == _installed_over:
        return  # no logger was made since: each traced cell calls this, it must cost nothing
    _installed_over = len(loggers)
    for name in ["codemode", *loggers]:
        if name == "codemode" or name.startswith("codemode."):
            logger = logging.getLogger(name)
            if _FILTER not in logger.filters:
                logger.addFilter(_FILTER)
