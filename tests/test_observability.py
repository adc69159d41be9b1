"""Traces, metrics and log context (`codemode.observability`), with the real OpenTelemetry SDK.

The SDK's in-memory span exporter and metric reader receive what codemode reports, on every
provider (the `provider` fixture's rows); `test_otlp.py` sends spans through the real OTLP
exporter. Every test restores the settings it changed.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any, cast

import pytest
import trio
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import codemode
from codemode import (
    CellLimits,
    CodeMode,
    ExecuteRequest,
    Provider,
    Toolbox,
    observability,
)
from tests.delegates import RecordingDelegate

BOUND = 30

SECRET_SOURCE = "const secretSource = 'source-c6f1';"
SECRET_ARGUMENT = "argument-9a3e"
SECRET_RESULT = "result-41bd"
SECRET_OUTPUT = "output-77e0"
SECRET_NOTICE = "notice-d2c5"


def attrs(thing: Any) -> dict[str, Any]:
    """A span's (or a data point's) attributes as a plain dict."""
    return dict(thing.attributes or {})


class _Counting(SpanProcessor):
    """Counts spans started and ended: none may be left open."""

    def __init__(self) -> None:
        self.started = 0
        self.ended = 0

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        self.started += 1

    def on_end(self, span: ReadableSpan) -> None:
        self.ended += 1


class Traced:
    """An SDK tracer and meter provider that codemode reports to, in memory."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.counting = _Counting()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer_provider.add_span_processor(self.counting)
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.tracer = self.tracer_provider.get_tracer("the application")

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        spans = list(self.exporter.get_finished_spans())
        return [span for span in spans if name is None or span.name == name]

    def one(self, name: str) -> ReadableSpan:
        (span,) = self.spans(name)
        return span

    def children(self, parent: ReadableSpan, name: str | None = None) -> list[ReadableSpan]:
        return [
            span
            for span in self.spans(name)
            if span.parent is not None and span.parent.span_id == parent.context.span_id
        ]

    def metric_points(self, name: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        assert data is not None
        return [
            point
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
            if metric.name == name
            for point in metric.data.data_points
        ]


@pytest.fixture
def traced() -> Iterator[Traced]:
    traced = Traced()
    previous = observability.configure(
        tracer_provider=traced.tracer_provider, meter_provider=traced.meter_provider
    )
    try:
        yield traced
    finally:
        observability.restore(previous)


def _toolbox(traced: Traced, log: list[str] | None = None) -> Toolbox:
    toolbox = Toolbox()

    @toolbox.tool
    async def lookup(key: str) -> str:
        """The value of a key."""
        with traced.tracer.start_as_current_span("app.lookup"):
            return f"{key}:{SECRET_RESULT}"

    @toolbox.tool
    def broken(key: str) -> str:
        """Always fails."""
        raise RuntimeError(f"broken {key}")

    return toolbox


TWO_CALLS = f"""
{SECRET_SOURCE}
text(await tools.lookup({{ key: "{SECRET_ARGUMENT}" }}));
notify("{SECRET_NOTICE}");
yield_control();
text("{SECRET_OUTPUT}");
text(await tools.lookup({{ key: "second" }}));
"""


async def test_a_cell_is_a_span_with_its_observations_tool_calls_and_the_applications_spans(
    provider: Provider, traced: Traced
) -> None:
    toolbox = _toolbox(traced)
    with trio.fail_after(BOUND):
        session = await provider.create_session()
        code_mode = CodeMode(session, toolbox, toolbox.definitions())
        with traced.tracer.start_as_current_span("app.turn"):
            first = await code_mode.exec("call-1", TWO_CALLS)
            assert first.status == "running"
            assert first.cell_id is not None
            # The second call runs after the yield: it still nests under its cell.
            second = await code_mode.wait({"cell_id": first.cell_id})
            assert second.status == "completed", second.text
        await session.shutdown()

    turn = traced.one("app.turn")
    (exec_span,) = traced.children(turn, "code_mode.exec")
    (cell,) = traced.children(exec_span, "code_mode.cell")
    assert cell.context.trace_id == turn.context.trace_id
    attributes = attrs(cell)
    assert attributes["codemode.cell.outcome"] == "completed"
    assert attributes["codemode.cell.id"] == first.cell_id
    assert attributes["codemode.cell.tool_calls"] == 2
    assert attributes["codemode.cell.observations"] == 2
    assert attributes["codemode.cell.turns"] >= 2
    assert attributes["codemode.cell.heap_bytes"] > 0
    assert attributes["codemode.cell.output_bytes"] > 0
    assert attributes["codemode.cell.cpu_ms"] >= 0
    assert attributes["codemode.provider"] in ("in_process", "process", "remote")
    assert [event.name for event in cell.events] == ["notify", "yield_control"]

    calls = sorted(traced.children(cell, "code_mode.tool_call"), key=lambda s: s.start_time or 0)
    assert [attrs(call)["gen_ai.tool.call.id"] for call in calls] == [
        "tool-1",
        "tool-2",
    ]
    for call in calls:
        assert attrs(call)["codemode.tool_call.outcome"] == "ok"
        assert len(traced.children(call, "app.lookup")) == 1  # the application's own span
    observations = traced.children(cell, "code_mode.observe")
    kinds = sorted(
        (attrs(span)["codemode.observe.kind"], attrs(span)["codemode.observe.outcome"])
        for span in observations
    )
    assert kinds == [("initial_response", "yielded"), ("wait", "completed")]
    (wait_span,) = traced.children(turn, "code_mode.wait")
    assert attrs(wait_span)["codemode.output.status"] == "completed"
    if attributes["codemode.provider"] == "in_process":
        # The runtime shares the process: its spans are made from the cell's report.
        (host_cell,) = traced.children(cell, "code_mode.host.cell")
        names = sorted(span.name for span in traced.children(host_cell))
        assert names == ["code_mode.host.javascript", "code_mode.host.start"]
    assert traced.counting.started == traced.counting.ended


def _every_recorded_text(traced: Traced) -> str:
    texts = []
    for span in traced.spans():
        texts.append(span.name)
        texts.extend(str(value) for value in (span.attributes or {}).values())
        for event in span.events:
            texts.extend(str(value) for value in (event.attributes or {}).values())
    return "\n".join(texts)


@pytest.mark.parametrize("record", [False, True], ids=["by-default", "when-asked"])
async def test_source_and_payloads_are_recorded_only_when_asked(
    traced: Traced, record: bool
) -> None:
    observability.configure(
        tracer_provider=traced.tracer_provider,
        meter_provider=traced.meter_provider,
        record_source=record,
        record_payloads=record,
        max_recorded_chars=4096,
    )
    toolbox = _toolbox(traced)
    with trio.fail_after(BOUND):
        async with codemode.open_in_process_provider() as provider:
            session = await provider.create_session()
            code_mode = CodeMode(session, toolbox, toolbox.definitions())
            first = await code_mode.exec("call-1", TWO_CALLS)
            await code_mode.wait({"cell_id": first.cell_id})
            failing = await code_mode.exec("call-2", 'await tools.broken({ key: "boom-5f1" })')
            assert failing.status == "failed"
    recorded = _every_recorded_text(traced)
    secrets = [SECRET_ARGUMENT, SECRET_RESULT, SECRET_NOTICE, "secretSource", "boom-5f1"]
    if record:
        for secret in [SECRET_ARGUMENT, SECRET_RESULT, SECRET_NOTICE, "secretSource"]:
            assert secret in recorded, secret
    else:
        for secret in [*secrets, SECRET_OUTPUT]:
            assert secret not in recorded, secret
    failed = [
        span
        for span in traced.spans("code_mode.cell")
        if attrs(span)["codemode.cell.outcome"] == "error"
    ]
    assert len(failed) == 1
    assert attrs(failed[0])["error.type"] == "Error"


def test_recorded_text_is_cut_to_the_configured_size() -> None:
    previous = observability.configure(record_source=True, max_recorded_chars=5)
    try:
        from codemode.observability._settings import clipped

        assert clipped("abcdefgh") == "abcde…"
        assert clipped("abc") == "abc"
    finally:
        observability.restore(previous)
    with pytest.raises(ValueError, match="max_recorded_chars must be at least 1, got 0"):
        observability.configure(max_recorded_chars=0)


async def _ended(session: codemode.Session, source: str) -> str:
    """Run a cell to its end; the outcome its span recorded is checked by the caller."""
    started = await session.execute(
        ExecuteRequest(tool_call_id="c", source=source, yield_time_ms=60_000), RecordingDelegate()
    )
    response = await started.initial_response()
    assert isinstance(response, codemode.Completed)
    return response.error_text or ""


@pytest.mark.parametrize("kind", ["in-process", pytest.param("process", marks=pytest.mark.slow)])
async def test_every_ending_closes_the_cell_span_with_its_outcome(
    traced: Traced, kind: str
) -> None:
    opener = (
        codemode.open_in_process_provider()
        if kind == "in-process"
        else codemode.open_process_provider()
    )
    with trio.fail_after(BOUND):
        async with opener as provider:
            limits = CellLimits(max_cpu_time_ms=50, max_heap_size_bytes=4 << 20)
            session = await provider.create_session(limits)
            await _ended(session, "text('fine')")
            await _ended(session, "throw new TypeError('bad')")
            await _ended(session, "while (true) {}")
            await _ended(session, "const a = []; while (true) a.push('x'.repeat(1000));")
            started = await session.execute(
                ExecuteRequest(tool_call_id="t", source="await new Promise(() => {})"),
                RecordingDelegate(),
                observe_initial=False,
            )
            await session.terminate(started.cell_id)
            await session.shutdown()
    outcomes = sorted(
        (
            attrs(span)["codemode.cell.outcome"],
            attrs(span).get("error.type"),
        )
        for span in traced.spans("code_mode.cell")
    )
    assert outcomes == [
        ("completed", None),
        ("cpu_limit", "cpu_limit"),
        ("error", "TypeError"),
        ("heap_limit", "InternalError"),
        ("terminated", None),
    ]
    assert traced.counting.started == traced.counting.ended


@pytest.mark.slow
async def test_a_lost_host_ends_its_cells_spans_as_host_lost(traced: Traced) -> None:
    with trio.fail_after(BOUND):
        async with codemode.open_process_provider() as provider:
            session = await provider.create_session()
            delegate = RecordingDelegate()
            started = await session.execute(
                ExecuteRequest(tool_call_id="c", source="await new Promise(() => {})"),
                delegate,
                observe_initial=False,
            )
            (host,) = provider.statistics().hosts
            assert host.pid is not None
            os.kill(host.pid, signal.SIGKILL)
            await delegate.until(lambda: started.cell_id in delegate.closed)
    (cell,) = traced.spans("code_mode.cell")
    assert attrs(cell)["codemode.cell.outcome"] == "host_lost"
    assert traced.counting.started == traced.counting.ended


def _sum(traced: Traced, name: str, **labels: str) -> float:
    total = 0.0
    for point in traced.metric_points(name):
        if all(attrs(point).get(key) == value for key, value in labels.items()):
            value: Any = getattr(point, "value", None) or getattr(point, "count", 0)
            total += float(value)
    return total


async def test_metrics_count_a_scripted_workload_exactly(traced: Traced) -> None:
    toolbox = _toolbox(traced)
    with trio.fail_after(BOUND):
        async with codemode.open_in_process_provider(
            admission=codemode.AdmissionLimits(max_active_cells=2)
        ) as provider:
            session = await provider.create_session()
            code_mode = CodeMode(session, toolbox, toolbox.definitions())
            for index in range(3):
                await code_mode.exec(f"ok-{index}", 'text(await tools.lookup({ key: "k" }))')
            await code_mode.exec("bad", "throw new Error('x')")
            held = [
                await session.execute(
                    ExecuteRequest(tool_call_id=f"h{i}", source="await new Promise(() => {})"),
                    RecordingDelegate(),
                    observe_initial=False,
                )
                for i in range(2)
            ]
            refused = await code_mode.exec("refused", "text(1)")
            assert "too many active cells" in refused.text
            for started in held:
                await session.terminate(started.cell_id)
    assert _sum(traced, "codemode.cells.started") == 6
    assert _sum(traced, "codemode.cells.ended", **{"codemode.cell.outcome": "completed"}) == 3
    assert _sum(traced, "codemode.cells.ended", **{"codemode.cell.outcome": "error"}) == 1
    assert _sum(traced, "codemode.cells.ended", **{"codemode.cell.outcome": "terminated"}) == 2
    assert _sum(traced, "codemode.cells.active") == 0
    assert _sum(traced, "codemode.tool_calls.pending") == 0
    assert _sum(traced, "codemode.admission.refusals", **{"codemode.error.kind": "admission"}) == 1
    assert _sum(traced, "codemode.tool_call.duration") == 3
    assert _sum(traced, "codemode.host.tool_call.duration") == 3
    # Four initial responses and the two terminations (the held cells' first responses).
    assert _sum(traced, "codemode.cell.first_response.duration") == 6
    assert _sum(traced, "codemode.cell.cpu_time") == 6
    assert _sum(traced, "codemode.cell.duration") == 6


async def test_log_records_inside_a_cells_work_carry_its_cell_and_trace(
    traced: Traced, caplog: pytest.LogCaptureFixture
) -> None:
    toolbox = _toolbox(traced)
    with trio.fail_after(BOUND), caplog.at_level(logging.ERROR, logger="codemode"):
        async with codemode.open_in_process_provider() as provider:
            session = await provider.create_session()
            code_mode = CodeMode(session, toolbox, toolbox.definitions())
            await code_mode.exec("c", 'await tools.broken({ key: "k" })')
    (record,) = [r for r in caplog.records if r.name == "codemode.toolbox"]
    (cell,) = traced.spans("code_mode.cell")
    assert record.codemode_cell_id == "1"  # type: ignore[attr-defined]
    assert record.codemode_session_id == "session-1"  # type: ignore[attr-defined]
    assert record.otel_trace_id == f"{cell.context.trace_id:032x}"  # type: ignore[attr-defined]


def test_every_codemode_logger_gets_the_log_filter() -> None:
    import codemode_host.server  # noqa: F401

    import codemode.mcp
    import codemode.process
    import codemode.ray
    import codemode.remote  # noqa: F401

    observability.install_log_filter()
    names = [n for n in logging.root.manager.loggerDict if n.startswith("codemode")]
    assert "codemode.runtime" in names
    assert "codemode.toolbox" in names
    for name in names:
        logger = logging.getLogger(name)
        assert any(isinstance(f, observability.CellLogFilter) for f in logger.filters), name


async def test_without_an_sdk_nothing_is_made(provider: Provider) -> None:
    assert observability.lookup() is None  # the global providers are OpenTelemetry's proxies
    with trio.fail_after(BOUND):
        session = await provider.create_session()
        started = await session.execute(
            ExecuteRequest(tool_call_id="c", source="text(1)"), RecordingDelegate()
        )
        assert isinstance(await started.initial_response(), codemode.Completed)


BLOCKED = """
import importlib.abc, sys

class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError(f"{name} is blocked")
        return None

sys.meta_path.insert(0, Blocker())

import trio, codemode
from codemode import observability

async def main():
    async with codemode.open_in_process_provider() as provider:
        session = await provider.create_session()
        toolbox = codemode.Toolbox()

        @toolbox.tool
        def add(a: int, b: int) -> int:
            "The sum."
            return a + b

        code_mode = codemode.CodeMode(session, toolbox, toolbox.definitions())
        output = await code_mode.exec("c", "text(await tools.add({ a: 1, b: 2 }))")
        print(output.text.splitlines()[-1])

assert observability.lookup() is None
trio.run(main)
assert not any(name.startswith("opentelemetry") for name in sys.modules)
print("without opentelemetry")
"""


@pytest.mark.slow
def test_codemode_runs_without_opentelemetry_installed() -> None:
    finished = subprocess.run(
        [sys.executable, "-c", BLOCKED], capture_output=True, text=True, timeout=BOUND
    )
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.split() == ["3", "without", "opentelemetry"]


def test_the_wire_carries_the_trace_context_and_the_report_only_under_the_capability() -> None:
    from codemode.protocol import TRACE_CAPABILITY, CellClosed, Execute

    trace = observability.TraceContext(
        traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    )
    request = ExecuteRequest(tool_call_id="c", source="text(1)")
    plain = Execute(session_id="s", request=request)
    assert "trace" not in json.dumps(_builtins(plain))  # omitted: old hosts never see it
    traced_frame = Execute(session_id="s", request=request, trace=trace)
    assert _builtins(traced_frame)["trace"] == {"traceparent": trace.traceparent}
    assert "report" not in _builtins(CellClosed(session_id="s", cell_id="1"))
    assert TRACE_CAPABILITY == "trace-context"


def _builtins(message: object) -> dict[str, Any]:
    import msgspec

    value = msgspec.to_builtins(message)
    assert isinstance(value, dict)
    return value


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_the_traced_agent_example_prints_its_span_tree() -> None:
    finished = subprocess.run(
        [sys.executable, "-m", "examples.traced_agent"],
        capture_output=True,
        text=True,
        timeout=BOUND,
        cwd=ROOT,
    )
    assert finished.returncode == 0, finished.stderr
    names = [
        line.strip().split(" ")[0]
        for line in finished.stdout.splitlines()
        if line.strip().startswith(("agent.", "code_mode.", "weather_service."))
    ]
    assert names[:3] == ["agent.turn", "code_mode.exec", "code_mode.cell"]
    assert names.count("code_mode.tool_call") == 3
    assert names.count("weather_service.lookup") == 3


@pytest.mark.slow
def test_codemode_run_trace_prints_the_tree_after_the_output() -> None:
    finished = subprocess.run(
        [
            os.path.join(os.path.dirname(sys.executable), "codemode"),
            "run",
            "examples/weather.js",
            "--tools",
            "examples.weather_tools:toolbox",
            "--in-process",
            "--trace",
        ],
        capture_output=True,
        text=True,
        timeout=BOUND,
        cwd=ROOT,
    )
    assert finished.returncode == 0, finished.stderr
    assert "Script completed" in finished.stdout
    lines = finished.stderr.split("trace:\n", 1)[1].splitlines()
    assert lines[0].startswith("code_mode.exec ")
    assert lines[1].startswith("  code_mode.cell ")
    assert "outcome=completed" in lines[1]
    assert sum("code_mode.tool_call" in line for line in lines) == 5


async def test_a_callers_trace_context_continues_into_the_cell(traced: Traced) -> None:
    with traced.tracer.start_as_current_span("mcp.client") as remote:
        meta = {"traceparent": observability.inject(None).traceparent}
    with trio.fail_after(BOUND), observability.continued_trace(meta):
        async with codemode.open_in_process_provider() as provider:
            session = await provider.create_session()
            started = await session.execute(
                ExecuteRequest(tool_call_id="c", source="text(1)"), RecordingDelegate()
            )
            await started.initial_response()
    (cell,) = traced.spans("code_mode.cell")
    assert cell.context.trace_id == remote.get_span_context().trace_id
    assert cell.parent is not None
    assert cell.parent.span_id == remote.get_span_context().span_id


GLOBAL_SDK = """
import trio, codemode
from codemode import observability
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

assert observability.lookup() is None  # nothing configured yet: the fast path
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)  # what an application does, after codemode was imported
assert observability.lookup() is not None

async def main():
    async with codemode.open_in_process_provider() as cells:
        session = await cells.create_session()
        started = await session.execute(codemode.ExecuteRequest(tool_call_id="c", source="text(1)"), codemode.Toolbox())
        await started.initial_response()

trio.run(main)
print(sorted(span.name for span in exporter.get_finished_spans()))
"""


@pytest.mark.slow
def test_a_global_provider_set_after_import_is_found() -> None:
    finished = subprocess.run(
        [sys.executable, "-c", GLOBAL_SDK], capture_output=True, text=True, timeout=BOUND
    )
    assert finished.returncode == 0, finished.stderr
    assert "'code_mode.cell'" in finished.stdout


async def test_an_mcp_clients_traceparent_continues_into_the_cell(traced: Traced) -> None:
    from mcp import Client
    from mcp_types import RequestParamsMeta

    from codemode.mcp._serve import open_code_mode_service

    with traced.tracer.start_as_current_span("mcp.client") as remote:
        traceparent = observability.inject(None).traceparent
    with trio.fail_after(BOUND):
        async with (
            codemode.open_in_process_provider() as provider,
            open_code_mode_service(provider, Toolbox()) as service,
            Client(service.server(), mode="legacy") as client,
        ):
            meta = cast(RequestParamsMeta, {"traceparent": traceparent})
            await client.call_tool("exec", {"code": "text(1)"}, meta=meta)
            await client.call_tool("exec", {"code": "text(2)"})  # no trace sent: a root span
    first, second = sorted(traced.spans("code_mode.exec"), key=lambda span: span.start_time or 0)
    assert first.context.trace_id == remote.get_span_context().trace_id
    assert first.parent is not None
    assert first.parent.span_id == remote.get_span_context().span_id
    assert second.parent is None


async def test_a_governed_calls_span_records_its_decision(traced: Traced) -> None:
    toolbox = Toolbox()

    @toolbox.tool(needs_approval=True)
    async def send_mail(to: str) -> str:
        """Sends a mail."""
        return f"sent to {to}"

    @toolbox.tool
    async def read(key: str) -> str:
        """Reads."""
        return key

    async def approver(request: codemode.ApprovalRequest) -> codemode.Deny:
        return codemode.Deny("no")

    source = (
        'try { await tools.send_mail({ to: "x" }) } catch (e) { text(e.message) }'
        ' text(await tools.read({ key: "k" }))'
    )
    with trio.fail_after(BOUND):
        async with codemode.open_in_process_provider() as provider:
            session = await provider.create_session()
            code_mode = CodeMode(session, toolbox, toolbox.definitions(), approver=approver)
            output = await code_mode.exec("c", source)
            while output.status == "running":
                output = await code_mode.wait({"cell_id": output.cell_id})
    calls = {
        attrs(span)["gen_ai.tool.name"]: attrs(span) for span in traced.spans("code_mode.tool_call")
    }
    assert calls["send_mail"]["codemode.tool_call.decision"] == "declined"
    assert calls["send_mail"]["codemode.tool_call.outcome"] == "denied"
    assert calls["read"]["codemode.tool_call.decision"] == "allowed"
    assert calls["read"]["codemode.tool_call.outcome"] == "ok"
