"""Code mode as an MCP server: the `exec` and `wait` tools, one code-mode session per client.

Rules:
1. The server lists two tools, `exec` (argument `code`, a string) and `wait` (the reference's
   parameters), with the descriptions of the model layer; `exec`'s lists the enabled tools (the
   upstream MCP servers' and the Python ones), read again at every listing.
2. Each MCP client connection gets its own code-mode session, made on its first call: on stdio
   the one client of the process; over HTTP each `mcp-session-id`, shut down when the client
   ends its MCP session (`end_connection`). A 2026-07-28 client has no connection (the
   revision is sessionless), so those clients share one session.
3. A tool result is the `ToolOutput` as MCP content: text and image blocks, `isError` = not
   success. Errors the model can act on are results, never JSON-RPC errors.
4. A cell's `notify(text)` becomes a `notifications/message` (level `info`, logger
   `codemode.cell.<id>`) on the request that observes the cell (its `exec`, or a `wait` on it),
   plus a `notifications/progress` when that request carries a progress token; with no such
   request in flight it goes to the connection's standalone channel, where there is one.
5. Closing the service shuts every session down, which terminates their cells (shielded,
   bounded by `SHUTDOWN_TIMEOUT`).
6. `tools_changed()` tells the clients that `exec`'s description changed: a
   `subscriptions/listen` event for 2026-07-28 clients, a `notifications/tools/list_changed` on
   each handshake-era connection.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, Protocol

import mcp_types as types
import trio
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from .._api import CellId, InputText, JsonValue, NestedToolCall, Session
from .._combine import ToolSource
from .._governance import ApprovalRequest, Approve, DefaultPolicy, Deny, MarksApproval
from ..model import CodeMode, NamespaceDescription, ToolOutput, tool_specs
from ..observability import continued_trace

logger = logging.getLogger("codemode.mcp")

SHUTDOWN_TIMEOUT = 10.0
"""Seconds the service's close waits for each session's shutdown."""

INSTRUCTIONS = (
    "Code mode: `exec` runs JavaScript that calls the tools listed in its description "
    "(`await tools.name({...})`) and reports with `text(...)`; a script still running after its "
    "yield time answers `Script running with cell ID N`, to be resumed with `wait`."
)

Context = ServerRequestContext[Any, Any]


class Provider(Protocol):
    """What the service needs of a provider (`open_process_provider`, in-process)."""

    async def create_session(self) -> Session: ...


def call_tool_result(output: ToolOutput) -> types.CallToolResult:
    """`output` as MCP content (rule 3)."""
    content: list[types.ContentBlock] = []
    for item in output.items:
        if isinstance(item, InputText):
            content.append(types.TextContent(text=item.text))
            continue
        # The model layer checked every image already: a base64 `data:` URL of a known type.
        header, _, payload = item.image_url.partition(",")
        media_type = header.removeprefix("data:").split(";")[0]
        content.append(types.ImageContent(data=payload, mime_type=media_type))
    return types.CallToolResult(content=content, is_error=not output.success)


def _marks(tools: object) -> MarksApproval | None:
    """The tool source's approval marks, if it has them (a `Toolbox`, `combine`)."""
    return tools if isinstance(tools, MarksApproval) else None


def _connection_key(ctx: Context) -> str:
    request = ctx.request
    headers = getattr(request, "headers", None)
    if headers is None:
        return ""  # stdio: one client per process
    return str(headers.get("mcp-session-id") or "")


class _Connection:
    """One client's session and the requests that observe its cells."""

    def __init__(self, service: CodeModeService, session: Session) -> None:
        self._service = service
        self.session = session
        self._by_call: dict[str, Context] = {}
        self._by_cell: dict[CellId, Context] = {}
        self._progress: dict[int, float] = {}
        self._latest: Context | None = None
        self._calls = itertools.count(1)

    async def call(self, ctx: Context, name: str, arguments: dict[str, Any]) -> ToolOutput:
        self._latest = ctx
        code_mode = CodeMode(
            self.session,
            self,
            self._service.tools.definitions(),
            namespace_descriptions=self._service.namespace_descriptions,
            policy=DefaultPolicy(_marks(self._service.tools)),
            approver=self._approve,
        )
        try:
            if name == "exec":
                # Our own count, not the request id: clients sharing a session (rule 2) number
                # their requests independently.
                call_id = f"mcp-{next(self._calls)}"
                self._by_call[call_id] = ctx
                try:
                    return await code_mode.call("exec", call_id, arguments)
                finally:
                    del self._by_call[call_id]
            cell_id = arguments.get("cell_id")
            if not isinstance(cell_id, str):
                return await code_mode.wait(arguments)
            self._by_cell[cell_id] = ctx
            try:
                return await code_mode.wait(arguments)
            finally:
                if self._by_cell.get(cell_id) is ctx:
                    del self._by_cell[cell_id]
        finally:
            self._progress.pop(id(ctx), None)

    async def _approve(self, request: ApprovalRequest) -> Approve | Deny:
        """Ask the MCP client's user about a call that needs approval, with an elicitation
        on the request the cell is observed by (docs/governance.md); deny if it cannot ask."""
        ctx = self._by_cell.get(request.cell_id) or self._latest
        if ctx is None:
            return Deny("no MCP client request is open to ask through")
        asks = types.ClientCapabilities(elicitation=types.ElicitationCapability())
        if not ctx.session.check_client_capability(asks):
            return Deny("the MCP client cannot be asked (it does not support elicitation)")
        arguments = json.dumps(request.arguments, ensure_ascii=False)
        message = (
            f"Allow tools.{request.identifier}({arguments})"
            f" ({request.call_id} of exec cell {request.cell_id})?"
        )
        try:
            answer = await ctx.session.elicit_form(
                message,
                {"type": "object", "properties": {}},
                related_request_id=ctx.request_id,
            )
        except Exception as error:  # the client left, or refused the request
            return Deny(f"the MCP client could not be asked: {error}")
        if answer.action == "accept":
            return Approve()
        return Deny(f"the MCP client's user chose {answer.action}")

    # The SessionDelegate of this client's cells: tools go to the service's tool source.

    async def invoke_tool(self, call: NestedToolCall) -> JsonValue:
        return await self._service.tools.invoke_tool(call)

    async def notify(self, call_id: str, cell_id: CellId, text: str) -> None:
        await self._service.tools.notify(call_id, cell_id, text)
        ctx = self._by_cell.get(cell_id) or self._by_call.get(call_id)
        try:
            if ctx is not None:
                await self._send(ctx, cell_id, text, ctx.request_id)
                if ctx.meta is not None and ctx.meta.get("progress_token") is not None:
                    key = id(ctx)
                    self._progress[key] = self._progress.get(key, 0) + 1
                    await ctx.session.report_progress(self._progress[key], None, text)
            elif self._latest is not None:
                await self._send(self._latest, cell_id, text, None)
        except Exception as error:  # the client left: the notification has no one to reach
            logger.info("notification of cell %s not delivered: %s", cell_id, error)

    async def _send(
        self, ctx: Context, cell_id: CellId, text: str, request_id: types.RequestId | None
    ) -> None:
        message = types.LoggingMessageNotification(
            params=types.LoggingMessageNotificationParams(
                level="info", logger=f"codemode.cell.{cell_id}", data=text
            )
        )
        await ctx.session.send_notification(message, related_request_id=request_id)

    def cell_closed(self, cell_id: CellId) -> None:
        self._service.tools.cell_closed(cell_id)

    async def tools_changed(self) -> None:
        latest = self._latest
        if latest is None or latest.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return  # a 2026-07-28 client hears of it on its listen stream, if it has one
        try:
            await latest.session.send_tool_list_changed()
        except Exception as error:  # the client left
            logger.info("tools/list_changed not delivered: %s", error)


class CodeModeService:
    """`exec` and `wait` for the MCP clients of one server (see the module's rules).

    Args:
        provider: makes a session for each client.
        tools: the tools the cells may call (a `Toolbox`, an MCP toolbox, a combination).
        namespace_descriptions: headings of the exec description, by `ToolName.namespace`.
    """

    def __init__(
        self,
        provider: Provider,
        tools: ToolSource,
        namespace_descriptions: Mapping[str, NamespaceDescription] | None = None,
    ) -> None:
        self.tools = tools
        self.namespace_descriptions = dict(namespace_descriptions or {})
        self._provider = provider
        self._connections: dict[str, _Connection] = {}
        self._lock = trio.Lock()
        self._closed = False
        self._bus = InMemorySubscriptionBus()
        self._listeners = ListenHandler(self._bus)

    def server(self) -> Server[Any]:
        """A low-level MCP server serving this service (stdio, HTTP or in memory)."""
        return Server(
            "codemode",
            instructions=INSTRUCTIONS,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_subscriptions_listen=self._listeners,
        )

    async def tools_changed(self) -> None:
        """Tell every client that the tools (so `exec`'s description) changed (rule 6)."""
        await self._bus.publish(ToolsListChanged())
        for connection in list(self._connections.values()):
            await connection.tools_changed()

    async def _list_tools(
        self, ctx: Context, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        specs = tool_specs(
            "anthropic",
            self.tools.definitions(),
            namespace_descriptions=self.namespace_descriptions,
        )
        return types.ListToolsResult(
            tools=[
                types.Tool(
                    name=spec["name"],
                    description=spec["description"],
                    input_schema=spec["input_schema"],
                )
                for spec in specs
            ]
        )

    async def _call_tool(
        self, ctx: Context, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        if params.name not in CodeMode.tool_names:
            text = f"unknown tool {params.name!r}: code mode serves `exec` and `wait`"
            return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)
        connection = await self._connection(_connection_key(ctx))
        # A client's trace (`traceparent` in the request's `_meta`) continues into the cell.
        with continued_trace(ctx.meta):
            output = await connection.call(ctx, params.name, dict(params.arguments or {}))
        return call_tool_result(output)

    async def _connection(self, key: str) -> _Connection:
        async with self._lock:
            connection = self._connections.get(key)
            if connection is None:
                if self._closed:
                    raise RuntimeError("the code-mode MCP service is closed")
                session = await self._provider.create_session()
                connection = self._connections[key] = _Connection(self, session)
            return connection

    async def end_connection(self, key: str) -> None:
        """The client of `key` (an `mcp-session-id`) left: shut its session down."""
        async with self._lock:
            connection = self._connections.pop(key, None)
        if connection is not None:
            with trio.CancelScope(shield=True), trio.move_on_after(SHUTDOWN_TIMEOUT):
                await _shutdown(connection.session)

    async def aclose(self) -> None:
        """Shut every client's session down, terminating its cells (rule 5)."""
        self._closed = True
        self._listeners.close()
        connections, self._connections = list(self._connections.values()), {}
        with trio.CancelScope(shield=True), trio.move_on_after(SHUTDOWN_TIMEOUT):
            async with trio.open_nursery() as nursery:
                for connection in connections:
                    nursery.start_soon(_shutdown, connection.session)


async def _shutdown(session: Session) -> None:
    try:
        await session.shutdown()
    except Exception as error:  # a lost host has no cells left to stop
        logger.info("session shutdown: %s", error)


@asynccontextmanager
async def open_code_mode_service(
    provider: Provider,
    tools: ToolSource,
    namespace_descriptions: Mapping[str, NamespaceDescription] | None = None,
) -> AsyncIterator[CodeModeService]:
    """A `CodeModeService` whose sessions are shut down when the block ends."""
    service = CodeModeService(provider, tools, namespace_descriptions)
    try:
        yield service
    finally:
        await service.aclose()
