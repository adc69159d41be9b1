"""A first cell: run JavaScript that calls a Python tool, in this process.

Run: `.venv/bin/python examples/quickstart.py`
"""

from __future__ import annotations

import trio

import codemode
from codemode import (
    ExecuteRequest,
    JsonValue,
    NestedToolCall,
    Pending,
    RuntimeResponse,
    ToolDefinition,
    ToolName,
    WaitRequest,
    Yielded,
)

WEATHER = ToolDefinition(
    name="weather",
    tool_name=ToolName.plain("weather"),
    description="Current temperature of a city, in degrees Celsius.",
)

SOURCE = """
const cities = ["Paris", "Oslo", "Lima"];
const readings = await Promise.all(cities.map((city) => tools.weather({ city })));
readings.sort((a, b) => b.celsius - a.celsius);
text(`warmest: ${readings[0].city} at ${readings[0].celsius} C`);
notify("all cities checked");
store("last_readings", readings);
"""


class Delegate:
    """The application side: runs the tools a cell calls."""

    async def invoke_tool(self, call: NestedToolCall) -> JsonValue:
        city = call.input["city"]
        await trio.sleep(0.01)  # stands for a real request
        return {"city": city, "celsius": {"Paris": 11, "Oslo": -2, "Lima": 19}[city]}

    async def notify(self, call_id: str, cell_id: str, text: str) -> None:
        print(f"[notification from cell {cell_id}] {text}")

    def cell_closed(self, cell_id: str) -> None:
        print(f"[cell {cell_id} closed]")


async def main() -> None:
    async with codemode.open_in_process_provider() as provider:
        session = await provider.create_session()
        request = ExecuteRequest(tool_call_id="call-1", source=SOURCE, enabled_tools=[WEATHER])
        started = await session.execute(request, Delegate())
        response: RuntimeResponse | Pending = await started.initial_response()
        while isinstance(response, Yielded):  # still running: observe it again
            response = (await session.wait(WaitRequest(cell_id=started.cell_id))).response
        print(type(response).__name__, response.content_items)


if __name__ == "__main__":
    trio.run(main)
