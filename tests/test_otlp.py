"""Spans through the real OTLP/HTTP exporter, from the application and from a host run with
`codemode-host --otel`, to a local receiver that decodes them with the official protobuf
definitions (`opentelemetry-proto`): the whole tree, across the pipe, in one trace.
"""

from __future__ import annotations

import gzip
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import cast

import pytest
import trio
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

import codemode
from codemode import CodeMode, Toolbox, observability
from tests.remote_hosts import listening_host

BOUND = 60


class Receiver:
    """An OTLP/HTTP trace receiver on a loopback port, in a thread of its own."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, str, bytes, bytes, bytes]] = []  # service, name, ids
        self.sums: dict[tuple[str, str], float] = {}  # (service, metric) -> its points' sum
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path.endswith("/v1/metrics"):
                    metrics = ExportMetricsServiceRequest()
                    metrics.ParseFromString(body)
                    receiver._add_metrics(metrics)
                else:
                    request = ExportTraceServiceRequest()
                    request.ParseFromString(body)
                    receiver._add(request)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def _add(self, request: ExportTraceServiceRequest) -> None:
        with self._lock:
            for resource_spans in request.resource_spans:
                service = _service(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        self.spans.append(
                            (service, span.name, span.trace_id, span.span_id, span.parent_span_id)
                        )

    def _add_metrics(self, request: ExportMetricsServiceRequest) -> None:
        with self._lock:
            for resource_metrics in request.resource_metrics:
                service = _service(resource_metrics.resource.attributes)
                for scope_metrics in resource_metrics.scope_metrics:
                    for metric in scope_metrics.metrics:
                        kind = metric.WhichOneof("data")
                        points = getattr(metric, kind).data_points if kind else []
                        total = sum(
                            getattr(point, "as_int", 0) or getattr(point, "count", 0)
                            for point in points
                        )
                        key = (service, metric.name)
                        self.sums[key] = self.sums.get(key, 0) + total

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)


def _service(attributes: object) -> str:
    return next(
        (a.value.string_value for a in attributes if a.key == "service.name"),  # type: ignore[attr-defined]
        "",
    )


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    try:
        yield receiver
    finally:
        receiver.close()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["process", "remote"])
async def test_the_tree_reaches_an_otlp_receiver_across_the_pipe_and_the_socket(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    # The host reads OpenTelemetry's standard variables (it inherits the environment).
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    exporter = OTLPSpanExporter(endpoint=f"{receiver.endpoint}/v1/traces")
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = tracer_provider.get_tracer("the application")
    previous = observability.configure(tracer_provider=tracer_provider)
    toolbox = Toolbox()

    @toolbox.tool
    def lookup(key: str) -> str:
        """The value of a key."""
        with tracer.start_as_current_span("app.lookup"):
            return key.upper()

    async def one_turn(provider: codemode.Provider) -> None:
        session = await provider.create_session()
        code_mode = CodeMode(session, toolbox, toolbox.definitions())
        with tracer.start_as_current_span("app.turn"):
            output = await code_mode.exec(
                "c", 'text(await tools.lookup({ key: "a" })); yield_control();'
                ' text(await tools.lookup({ key: "b" }))'
            )  # fmt: skip
            await code_mode.wait({"cell_id": output.cell_id})
        await session.shutdown()

    try:
        with trio.fail_after(BOUND):
            if kind == "process":
                host = [sys.executable, "-m", "codemode_host", "--otel"]
                async with codemode.open_process_provider(host) as spawned:
                    await one_turn(spawned)
                # Leaving the block closed the host, which flushed its telemetry as it exited.
            else:
                async with listening_host("--otel") as running:
                    async with codemode.open_remote_provider([running.address]) as remote:
                        await one_turn(remote)
                    assert await running.stop() == 0  # SIGTERM: it flushes, then exits
    finally:
        observability.restore(previous)
        tracer_provider.shutdown()

    spans = {
        span_id: (service, name, trace_id, parent)
        for service, name, trace_id, span_id, parent in receiver.spans
    }

    def named(name: str) -> list[bytes]:
        return [span_id for span_id, span in spans.items() if span[1] == name]

    (turn,) = named("app.turn")
    (cell,) = named("code_mode.cell")
    assert {span[2] for span in spans.values()} == {spans[turn][2]}  # one trace
    (exec_span,) = named("code_mode.exec")
    assert spans[exec_span][3] == turn
    assert spans[cell][3] == exec_span
    calls = named("code_mode.tool_call")
    assert len(calls) == 2
    assert all(spans[call][3] == cell for call in calls)
    assert sorted(spans[span][3] for span in named("app.lookup")) == sorted(calls)
    (host_cell,) = named("code_mode.host.cell")
    service, _, _, parent = spans[host_cell]
    assert service == "codemode-host"  # made in the host process, from its own exporter
    assert parent == cell
    host_children = sorted(span[1] for span in spans.values() if span[3] == host_cell)
    assert host_children == ["code_mode.host.javascript", "code_mode.host.start"]
    # The host's wait span is a child of the client's observation of that wait.
    (host_wait,) = named("code_mode.host.observe")
    assert spans[spans[host_wait][3]][1] == "code_mode.observe"
    # The host's own metrics reached the receiver too.
    assert receiver.sums[("codemode-host", "codemode.cells.ended")] == 1
    assert receiver.sums[("codemode-host", "codemode.host.tool_call.duration")] == 2


@pytest.mark.slow
def test_the_host_names_the_missing_sdk_in_one_line() -> None:
    import subprocess

    blocked = (
        "import importlib.abc, sys\n"
        "class B(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.startswith('opentelemetry.sdk') or name.startswith('opentelemetry.exporter'):\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, B())\n"
        "sys.argv = ['codemode-host', '--otel']\n"
        "from codemode_host.__main__ import main\n"
        "main()\n"
    )
    finished = subprocess.run(
        [sys.executable, "-c", blocked],
        capture_output=True,
        text=True,
        timeout=BOUND,
        stdin=subprocess.DEVNULL,
    )
    assert finished.returncode == 2
    assert finished.stderr == (
        "codemode-host: error: codemode-host --otel needs the OpenTelemetry SDK:"
        " pip install 'codemode[otel-sdk]'\n"
    )


@pytest.mark.slow
async def test_codemode_mcp_serve_otel_continues_a_clients_trace(receiver: Receiver) -> None:
    import os

    from mcp import Client, StdioServerParameters
    from mcp_types import RequestParamsMeta

    from tests.typecheck import ROOT

    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    parent = "00f067aa0ba902b7"
    server = StdioServerParameters(
        command=str(Path(sys.executable).with_name("codemode")),
        args=["mcp", "serve", "--otel", "--in-process"],
        cwd=ROOT,
        env={**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint},
    )
    with trio.fail_after(BOUND):
        async with Client(server) as client:
            meta = cast(RequestParamsMeta, {"traceparent": f"00-{trace_id}-{parent}-01"})
            await client.call_tool("exec", {"code": "text(1)"}, meta=meta)
    # The server flushed its spans as it exited (the client closed its stdin).
    spans = {
        span_id: (service, name, tid, up) for service, name, tid, span_id, up in receiver.spans
    }
    (exec_span,) = [s for s in spans.values() if s[1] == "code_mode.exec"]
    assert exec_span[0] == "codemode-mcp"
    assert exec_span[2].hex() == trace_id
    assert exec_span[3].hex() == parent
    assert any(s[1] == "code_mode.cell" and s[2].hex() == trace_id for s in spans.values())
