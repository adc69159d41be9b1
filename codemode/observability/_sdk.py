"""The OpenTelemetry SDK set up for codemode's own programs: `codemode-host --otel` and
`codemode run --trace`.

A library never sets OpenTelemetry's global providers (codemode does not, anywhere else); a
program does, and these two are programs. `install_from_environment` reads OpenTelemetry's
standard variables (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_EXPORTER` and
`OTEL_METRICS_EXPORTER`: `otlp`, the default, `console` or `none`; the OTLP exporter's
`OTEL_EXPORTER_OTLP_*`, sent as protobuf over HTTP). The SDK comes with `codemode[otel-sdk]`;
without it, `SdkMissingError` says so in one line.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from ..errors import CodeModeError
from . import _telemetry

EXTRA = "codemode[otel-sdk]"


class SdkMissingError(CodeModeError):
    """The OpenTelemetry SDK (or its OTLP exporter) is not installed."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what} needs the OpenTelemetry SDK: pip install '{EXTRA}'")


def require_sdk(what: str) -> None:
    """Raise `SdkMissingError` naming `what` unless the SDK and its OTLP exporter import."""
    try:
        import opentelemetry.exporter.otlp.proto.http
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        raise SdkMissingError(what) from None


def _exporter(variable: str, otlp: Callable[[], Any], console: Callable[[], Any]) -> Any:
    choice = os.environ.get(variable, "otlp").strip().lower() or "otlp"
    if choice == "none":
        return None
    if choice == "console":
        return console()
    if choice != "otlp":
        raise CodeModeError(f"${variable}: expected otlp, console or none, got {choice!r}")
    return otlp()


def install_from_environment(service_name: str, what: str | None = None) -> Callable[[], None]:
    """Set the global tracer and meter providers from the `OTEL_*` variables; returns the
    function that flushes and shuts them down (call it before the program exits).
    `service_name`: the default `service.name`; `what`: the program and option, as the
    missing SDK's error names them (default `<service_name> --otel`).

    Raises:
        SdkMissingError: the SDK is not installed.
        CodeModeError: an `OTEL_*_EXPORTER` variable names an exporter this does not know.
    """
    require_sdk(what or f"{service_name} --otel")
    from opentelemetry import metrics, trace
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import (
        ConsoleMetricExporter,
        PeriodicExportingMetricReader,
    )
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service_name}
    resource = Resource.create(attributes)  # merges OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
    span_exporter = _exporter(
        "OTEL_TRACES_EXPORTER", OTLPSpanExporter, lambda: ConsoleSpanExporter(out=sys.stderr)
    )
    metric_exporter = _exporter(
        "OTEL_METRICS_EXPORTER",
        OTLPMetricExporter,
        lambda: ConsoleMetricExporter(out=sys.stderr),
    )
    tracer_provider = TracerProvider(resource=resource)
    if span_exporter is not None:
        tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
    readers = [] if metric_exporter is None else [PeriodicExportingMetricReader(metric_exporter)]
    meter_provider = MeterProvider(resource=resource, metric_readers=readers)
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(meter_provider)
    _telemetry.reporting_here = True

    def shut_down() -> None:
        tracer_provider.shutdown()
        meter_provider.shutdown()

    return shut_down


class InMemoryTrace:
    """An SDK tracer provider that keeps the spans in memory, made current for codemode by
    `configure` (no global provider is set) until `close()`."""

    def __init__(self) -> None:
        require_sdk("--trace")
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
            InMemorySpanExporter,
        )

        from . import _settings

        self._exporter = InMemorySpanExporter()
        self._provider = TracerProvider()
        self._provider.add_span_processor(SimpleSpanProcessor(self._exporter))
        self._previous = _settings.configure(tracer_provider=self._provider)

    def spans(self) -> list[Any]:
        return list(self._exporter.get_finished_spans())

    def close(self) -> None:
        from . import _settings

        _settings.restore(self._previous)
        self._provider.shutdown()
