"""See inside a cell: OpenTelemetry traces, metrics and log context (`docs/observability.md`).

codemode reports on the OpenTelemetry API (`pip install 'codemode[otel]'`) to the global tracer
and meter providers, or to the ones `configure` names, and does nothing measurable until an SDK
is configured: it never sets a provider itself. Each cell is a span `code_mode.cell`; its
observations, tool calls and the runtime's side (`code_mode.host.*`) are spans under it; a
host process joins the trace through the W3C trace context in its frames.

Nothing of a cell's source, its tool arguments or results, its output or an exception's message
is recorded unless `configure(record_source=True, record_payloads=True)` says so.
"""

from . import _telemetry
from ._cells import CellTrace as CellTrace
from ._cells import SessionTraces as SessionTraces
from ._host_spans import emit_host_spans as emit_host_spans
from ._host_spans import host_observation as host_observation
from ._host_spans import record_host_metrics as record_host_metrics
from ._logs import CellLogFilter as CellLogFilter
from ._logs import install_log_filter as install_log_filter
from ._model import ModelSpan as ModelSpan
from ._model import model_span as model_span
from ._report import CellReport as CellReport
from ._report import TraceContext as TraceContext
from ._report import error_type as error_type
from ._sdk import InMemoryTrace as InMemoryTrace
from ._sdk import SdkMissingError as SdkMissingError
from ._sdk import install_from_environment as install_from_environment
from ._sdk import require_sdk as require_sdk
from ._settings import DEFAULT_RECORDED_CHARS as DEFAULT_RECORDED_CHARS
from ._settings import Settings as Settings
from ._settings import configure as configure
from ._settings import current as current_settings
from ._settings import restore as restore
from ._telemetry import Telemetry as Telemetry
from ._telemetry import annotate_current_span as annotate_current_span
from ._telemetry import continued_trace as continued_trace
from ._telemetry import extract as extract
from ._telemetry import inject as inject
from ._telemetry import lookup as lookup
from ._tree import render_tree as render_tree


def reporting_here() -> bool:
    """Whether this program set the OpenTelemetry SDK up itself (`codemode-host --otel`)."""
    return _telemetry.reporting_here


__all__ = [
    "DEFAULT_RECORDED_CHARS",
    "CellLogFilter",
    "CellReport",
    "CellTrace",
    "InMemoryTrace",
    "ModelSpan",
    "SdkMissingError",
    "SessionTraces",
    "Settings",
    "Telemetry",
    "TraceContext",
    "annotate_current_span",
    "configure",
    "continued_trace",
    "current_settings",
    "emit_host_spans",
    "error_type",
    "extract",
    "host_observation",
    "inject",
    "install_from_environment",
    "install_log_filter",
    "lookup",
    "model_span",
    "record_host_metrics",
    "render_tree",
    "reporting_here",
    "require_sdk",
    "restore",
]
