"""A small MCP server written with the `mcp` SDK, for what server-everything cannot show.

Run as a script (`python tests/mcp_test_server.py`), it serves on stdio:
- `fail`: a result with `isError: true`; `refuse`: a JSON-RPC error instead of a result;
- `block`: waits until cancelled; `wait_blocked` returns once a `block` call runs,
  `wait_cancelled` once a `block` call was cancelled (so a test waits on events, not time);
- `exit`: the process exits at once, mid-call (a server that dies);
- `pid`: the server's process id (a restarted server has a new one);
- `add_tool`: adds the tool `extra` and sends `notifications/tools/list_changed`.
"""

from __future__ import annotations

import os
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

OBJECT: dict[str, Any] = {"type": "object", "properties": {}}
TOOLS = [
    "fail", "refuse", "block", "wait_blocked", "wait_cancelled", "exit", "pid", "add_tool",
    "wipe", "peek",
]  # fmt: skip
ANNOTATIONS = {
    "wipe": types.ToolAnnotations(destructive_hint=True),
    "peek": types.ToolAnnotations(destructive_hint=True, read_only_hint=True),
}


class State:
    def __init__(self) -> None:
        self.tools = list(TOOLS)
        self.blocked = anyio.Event()
        self.cancelled = anyio.Event()


STATE = State()


def text(value: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=value)])


async def list_tools(
    ctx: Any, params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    return types.ListToolsResult(
        tools=[
            types.Tool(name=name, input_schema=OBJECT, annotations=ANNOTATIONS.get(name))
            for name in STATE.tools
        ]
    )


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    name = params.name
    if name == "fail":
        return types.CallToolResult(content=[types.TextContent(text="it broke")], is_error=True)
    if name == "refuse":
        raise MCPError(code=types.INVALID_PARAMS, message="refused on purpose")
    if name == "block":
        STATE.blocked.set()
        try:
            await anyio.sleep_forever()
        finally:
            STATE.cancelled.set()
    if name == "wait_blocked":
        await STATE.blocked.wait()
        return text("blocked")
    if name == "wait_cancelled":
        await STATE.cancelled.wait()
        return text("cancelled")
    if name == "exit":
        os._exit(3)
    if name == "pid":
        return text(str(os.getpid()))
    if name in ("wipe", "peek"):
        return text(f"{name} ran")
    if name == "add_tool":
        STATE.tools.append("extra")
        # Both eras: a listen stream (2026-07-28) and the handshake era's notification.
        await BUS.publish(ToolsListChanged())
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            await ctx.session.send_tool_list_changed()
        return text("added")
    if name == "extra":
        return text("extra")
    raise MCPError(code=types.INVALID_PARAMS, message=f"unknown tool {name}")


BUS = InMemorySubscriptionBus()
SERVER = Server(
    "codemode-test",
    on_list_tools=list_tools,
    on_call_tool=call_tool,
    on_subscriptions_listen=ListenHandler(BUS),
)


async def main() -> None:
    async with stdio_server() as (read, write):
        await SERVER.run(read, write, SERVER.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main, backend="trio")
