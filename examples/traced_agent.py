"""One agent turn, traced: a cell that makes three tool calls, one of them after a yield.

Runs offline (the model's two tool calls are written out below) and prints the turn's span
tree with timings. It needs the OpenTelemetry SDK (`pip install 'codemode[otel-sdk]'`):

    python -m examples.traced_agent

In an application, configure the SDK as usual (an OTLP exporter to your collector, say) and
codemode's spans join the application's trace: docs/observability.md.
"""

from __future__ import annotations

import trio
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import codemode
from codemode import observability

TEMPERATURES = {"Paris": 11, "Oslo": -2, "Lima": 19}

toolbox = codemode.Toolbox()
exporter = InMemorySpanExporter()
tracer_provider = TracerProvider()
tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
tracer = tracer_provider.get_tracer("traced_agent")


@toolbox.tool
async def temperature(city: str) -> int:
    """The current temperature of a city, in celsius."""
    with tracer.start_as_current_span("weather_service.lookup"):  # the application's own span
        await trio.sleep(0.01)
        return TEMPERATURES[city]


CELL = """
const paris = await tools.temperature({ city: "Paris" });
const oslo = await tools.temperature({ city: "Oslo" });
text(`Paris ${paris}, Oslo ${oslo}`);
yield_control();
text(`Lima ${await tools.temperature({ city: "Lima" })}`);
"""


async def main() -> None:
    observability.configure(tracer_provider=tracer_provider)
    async with codemode.open_process_provider() as provider:
        session = await provider.create_session()
        code_mode = codemode.CodeMode(session, toolbox, toolbox.definitions())
        with tracer.start_as_current_span("agent.turn"):
            first = await code_mode.exec("call-1", CELL)  # the model's exec call
            print(first.text, end="\n\n")
            second = await code_mode.wait({"cell_id": first.cell_id})  # its wait call
            print(second.text, end="\n\n")
    print(observability.render_tree(list(exporter.get_finished_spans())))


if __name__ == "__main__":
    trio.run(main)
