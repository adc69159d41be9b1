"""codemode's tracer and instruments, found when a cell starts; None when nothing would record.

`opentelemetry-api` is optional (`codemode[otel]`): without it, or while neither a tracer
provider nor a meter provider is configured (OpenTelemetry's global providers are proxies until
an SDK sets them), `lookup()` returns None and a cell costs one call here and nothing else.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from . import _settings
from ._report import TraceContext

trace: Any = None
"""`opentelemetry.trace` once `lookup()` loaded it (None before, and without the API)."""
metrics: Any = None
_loaded = False
_metrics_state: Any = None
"""The module holding the API's global meter provider, when the globals can be probed
(`_globals_probe`), or None."""

reporting_here = False
"""True in a program that set the SDK up itself (`_sdk.install_from_environment`): a host then
reports its own spans and metrics."""


def _load_api() -> None:
    """Import the OpenTelemetry API on first use (never at codemode's import: it costs the
    CLI's start some 25 ms); `trace` stays None without `codemode[otel]`."""
    global trace, metrics, _loaded, _metrics_state
    if not _loaded:
        _loaded = True
        try:
            from opentelemetry import metrics as otel_metrics
            from opentelemetry import trace as otel_trace
        except ImportError:
            return
        trace, metrics = otel_trace, otel_metrics
        _metrics_state = _globals_probe()


def _globals_probe() -> Any:
    """The module of the API's global meter provider, when a test of whether the two global
    providers are still unset can read them (`lookup`: two attribute reads), or None: asking
    `get_tracer_provider()` and `get_meter_provider()` each cell cost about 5 % of a trivial
    cell's instructions on the client (they read the environment). The globals are read only
    if they exist and no `OTEL_PYTHON_*_PROVIDER` variable names a provider to load lazily."""
    import os

    from opentelemetry.metrics import _internal as metrics_state

    if "OTEL_PYTHON_TRACER_PROVIDER" in os.environ or "OTEL_PYTHON_METER_PROVIDER" in os.environ:
        return None
    if not hasattr(trace, "_TRACER_PROVIDER") or not hasattr(metrics_state, "_METER_PROVIDER"):
        return None
    return metrics_state


SCOPE = "codemode"
"""The instrumentation scope every codemode span and metric belongs to."""


def _version() -> str:
    import importlib.metadata  # not at import: it loads the email package (and socket)

    try:
        return importlib.metadata.version("codemode")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - a source tree
        return "0"


class Telemetry:
    """A tracer and codemode's instruments from one pair of providers (`docs/observability.md`
    lists every instrument)."""

    def __init__(self, tracer_provider: Any, meter_provider: Any, *, metrics_on: bool) -> None:
        version = _version()
        self._providers = (tracer_provider, meter_provider)  # `_made` is keyed by their ids
        self.tracer = tracer_provider.get_tracer(SCOPE, version)
        self.metrics_on = metrics_on
        meter = meter_provider.get_meter(SCOPE, version)
        self.cells_started = meter.create_counter(
            "codemode.cells.started", unit="{cell}", description="Cells admitted"
        )
        self.cells_ended = meter.create_counter(
            "codemode.cells.ended", unit="{cell}", description="Cells closed, by outcome"
        )
        self.cells_active = meter.create_up_down_counter(
            "codemode.cells.active", unit="{cell}", description="Cells admitted and not closed"
        )
        self.tool_calls_pending = meter.create_up_down_counter(
            "codemode.tool_calls.pending",
            unit="{call}",
            description="Nested tool calls running in the application",
        )
        self.refusals = meter.create_counter(
            "codemode.admission.refusals",
            unit="{request}",
            description="Executes refused, by error kind",
        )
        self.generations = meter.create_counter(
            "codemode.host.generations",
            unit="{session}",
            description="Sessions re-opened on a new host after a host loss",
        )
        self.first_response = meter.create_histogram(
            "codemode.cell.first_response.duration",
            unit="s",
            description="From execute to the cell's first response",
        )
        self.tool_call_duration = meter.create_histogram(
            "codemode.tool_call.duration",
            unit="s",
            description="A nested tool call's round trip, seen by the application",
        )
        self.host_tool_call_duration = meter.create_histogram(
            "codemode.host.tool_call.duration",
            unit="s",
            description="A nested tool call's round trip, seen by the runtime",
        )
        self.cell_cpu = meter.create_histogram(
            "codemode.cell.cpu_time", unit="ms", description="CPU time of a cell's JavaScript"
        )
        self.cell_duration = meter.create_histogram(
            "codemode.cell.duration", unit="s", description="From execute to the cell's close"
        )


_made: dict[tuple[int, int], Telemetry] = {}


def _real(provider: Any, proxy_names: tuple[str, ...]) -> bool:
    # The global providers are proxies (or no-ops) until an SDK is set; their class names are
    # the stable way to tell, without reaching into OpenTelemetry's private state.
    return type(provider).__name__ not in proxy_names


def lookup() -> Telemetry | None:
    """The telemetry a cell starting now reports to, or None when nothing would record."""
    # Read inline, not through calls: this runs for every cell of an application that does
    # not trace, where it is the whole of observability's cost.
    if not _loaded:
        _load_api()
    if trace is None:
        return None
    settings = _settings.current()
    if (
        _metrics_state is not None
        and settings.tracer_provider is None
        and settings.meter_provider is None
        and trace._TRACER_PROVIDER is None
        and _metrics_state._METER_PROVIDER is None
    ):
        return None  # the common case of a library: nobody configured OpenTelemetry
    tracer_provider = settings.tracer_provider or trace.get_tracer_provider()
    meter_provider = settings.meter_provider or metrics.get_meter_provider()
    traces_on = _real(tracer_provider, ("ProxyTracerProvider", "NoOpTracerProvider"))
    metrics_on = _real(meter_provider, ("_ProxyMeterProvider", "NoOpMeterProvider"))
    if not traces_on and not metrics_on:
        return None
    key = (id(tracer_provider), id(meter_provider))
    made = _made.get(key)
    if made is None:
        made = _made[key] = Telemetry(tracer_provider, meter_provider, metrics_on=metrics_on)
    return made


def forget() -> None:
    """Drop the tracers and instruments made so far (tests that swap providers)."""
    _made.clear()


def annotate_current_span(key: str, value: str) -> None:
    """Set an attribute on the current span, if one records (a governed call's decision on
    its `code_mode.tool_call` span); nothing while OpenTelemetry was never looked up."""
    if trace is None:
        return
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attribute(key, value)


_propagator: Any = None


def _trace_context_propagator() -> Any:
    global _propagator
    if _propagator is None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        _propagator = TraceContextTextMapPropagator()
    return _propagator


def inject(context: Any) -> TraceContext:
    """The W3C trace context of `context`'s current span, as a frame carries it."""
    carrier: dict[str, str] = {}
    _trace_context_propagator().inject(carrier, context=context)
    return TraceContext(traceparent=carrier["traceparent"], tracestate=carrier.get("tracestate"))


def extract(trace_context: TraceContext) -> Any:
    """The OpenTelemetry context a frame's trace context names (its span as the parent)."""
    carrier = {"traceparent": trace_context.traceparent}
    if trace_context.tracestate is not None:
        carrier["tracestate"] = trace_context.tracestate
    return _trace_context_propagator().extract(carrier)


@contextmanager
def continued_trace(meta: Mapping[str, Any] | None) -> Iterator[None]:
    """Make the trace a caller sent (`traceparent`, `tracestate` in `meta`, as an MCP
    request's `_meta` carries them) current for the block, when something records."""
    traceparent = meta.get("traceparent") if meta is not None else None
    if not isinstance(traceparent, str) or lookup() is None:
        yield
        return
    tracestate = meta.get("tracestate") if meta is not None else None
    context = extract(
        TraceContext(
            traceparent=traceparent,
            tracestate=tracestate if isinstance(tracestate, str) else None,
        )
    )
    from opentelemetry import context as otel_context

    token = otel_context.attach(context)
    try:
        yield
    finally:
        otel_context.detach(token)
