"""What the application chose to record, and which OpenTelemetry providers codemode reports to.

By default codemode records no source, no tool arguments or results, no output text and no
exception message (spans carry exception types only), and it reports to OpenTelemetry's global
tracer and meter providers, looked up when a cell starts (never at import), as instrumentation
libraries do. `configure` changes either, process-wide.
"""

from __future__ import annotations

import dataclasses
from typing import Any

DEFAULT_RECORDED_CHARS = 1024
"""How many characters of a recorded source or payload a span keeps (`configure`)."""


@dataclasses.dataclass(frozen=True)
class Settings:
    """What codemode records (see `configure`)."""

    record_source: bool = False
    record_payloads: bool = False
    max_recorded_chars: int = DEFAULT_RECORDED_CHARS
    tracer_provider: Any = None
    meter_provider: Any = None


_current = Settings()


def configure(
    *,
    record_source: bool = False,
    record_payloads: bool = False,
    max_recorded_chars: int = DEFAULT_RECORDED_CHARS,
    tracer_provider: Any = None,
    meter_provider: Any = None,
) -> Settings:
    """Choose what codemode's spans record and where they go; returns the previous settings.

    Args:
        record_source: put each cell's JavaScript on its span (`codemode.cell.source`).
        record_payloads: put tool arguments and results, `notify` texts and output sizes'
            texts on the spans (`codemode.tool_call.arguments`, `codemode.tool_call.result`,
            the `notify` event's `codemode.notify.text`).
        max_recorded_chars: what a recorded source or payload is cut to (at least 1).
        tracer_provider: an OpenTelemetry `TracerProvider` to use instead of the global one.
        meter_provider: an OpenTelemetry `MeterProvider` to use instead of the global one.

    Raises:
        ValueError: `max_recorded_chars` is below 1.
    """
    global _current
    if max_recorded_chars < 1:
        raise ValueError(f"max_recorded_chars must be at least 1, got {max_recorded_chars}")
    previous = _current
    _current = Settings(
        record_source=record_source,
        record_payloads=record_payloads,
        max_recorded_chars=max_recorded_chars,
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
    )
    return previous


def restore(settings: Settings) -> None:
    """Put back settings `configure` returned."""
    global _current
    _current = settings


def current() -> Settings:
    """The settings in force."""
    return _current


def clipped(text: str) -> str:
    """`text` cut to the recorded size."""
    limit = _current.max_recorded_chars
    return text if len(text) <= limit else text[:limit] + "…"
