"""`open_mcp_toolbox`: MCP servers' tools served to cells, as one `SessionDelegate`.

Rules:
1. `open_mcp_toolbox` owns a nursery (the servers' connection tasks); it connects to every
   server before its body runs and raises `McpConnectionError` if one cannot be reached. An
   exception raised in its body leaves it as itself.
2. `definitions()` lists the tools the servers list now (a `tools/list_changed` updates it);
   a tool whose JavaScript identifier another tool took already is left out, with a warning.
3. `invoke_tool` routes by namespace (`mcp__<server>`) to that server; the cell receives the
   `CallToolResult` (see `_definitions`). Transport failures reject the cell's promise with a
   text naming the server (`_connection`).
4. `notify` goes to `on_notify` (or the log), as `Toolbox` does; a toolbox keeps nothing per
   cell.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

import trio

from .._api import CellId, JsonValue, NestedToolCall, ToolDefinition, ToolName
from .._governance import NO_APPROVER, approved, denial
from .._identifiers import normalize_identifier
from .._toolbox import NotifyHandler, deliver_notification
from .._trio import open_service_nursery
from ..errors import ToolError
from ..model import NamespaceDescription
from ._connection import McpConnectionError, ServerLink
from ._definitions import (
    arguments_of,
    namespace,
    namespace_description,
    result_value,
    tool_definition,
)
from ._servers import ServerSpec, servers_from

logger = logging.getLogger("codemode.mcp")

CONNECT_TIMEOUT = 30.0
"""Seconds a server may take to start, shake hands and list its tools (npx may download)."""


class McpToolbox:
    """The tools of some MCP servers, and the `SessionDelegate` that serves them.

    Made by `open_mcp_toolbox`, usable while its block runs. Pass `definitions()` as the
    enabled tools and the toolbox as the delegate (or `codemode.combine` it with a `Toolbox`),
    and `namespace_descriptions()` to `CodeMode` for a heading per server.
    """

    def __init__(self, links: dict[str, ServerLink], on_notify: NotifyHandler | None) -> None:
        self._links = links
        self._by_namespace = {namespace(name): link for name, link in links.items()}
        self._on_notify = on_notify
        self._changed = trio.Event()

    def _tools_changed(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_definitions_changed(self) -> None:
        """Return once a server's tools changed (after its `tools/list_changed`)."""
        await self._changed.wait()

    def definitions(self) -> list[ToolDefinition]:
        """Every server's tools as code-mode tools, servers in the order they were given."""
        taken: dict[str, str] = {}
        definitions = []
        for name, link in self._links.items():
            for tool in link.tools:
                definition = tool_definition(name, tool)
                identifier = normalize_identifier(definition.name)
                if identifier in taken:
                    logger.warning(
                        "MCP tool %s is left out: tools.%s is %s already",
                        definition.name,
                        identifier,
                        taken[identifier],
                    )
                    continue
                taken[identifier] = definition.name
                definitions.append(definition)
        return definitions

    def namespace_descriptions(self) -> dict[str, NamespaceDescription]:
        """A heading for each server's tools, keyed by `ToolName.namespace`."""
        return {
            namespace(name): namespace_description(name, link.info)
            for name, link in self._links.items()
        }

    def needs_approval(self, tool: ToolName) -> bool:
        """Whether the server annotates `tool` as destructive (`destructiveHint: true`) and not
        read-only: the default policy asks before such a call (`docs/governance.md`)."""
        link = None if tool.namespace is None else self._by_namespace.get(tool.namespace)
        if link is None:
            return False
        for listed in link.tools:
            if listed.name == tool.name:
                hints = listed.annotations
                return (
                    hints is not None
                    and hints.destructive_hint is True
                    and hints.read_only_hint is not True
                )
        return False

    async def invoke_tool(self, call: NestedToolCall) -> JsonValue:
        """Call the MCP tool on its server; the result is the MCP `CallToolResult` object.

        Raises:
            ToolError: the argument is not an object, the tool is no MCP tool of these servers,
                or the server could not be reached or broke the connection.
        """
        namespace_name = call.tool_name.namespace
        link = None if namespace_name is None else self._by_namespace.get(namespace_name)
        if link is None:
            raise ToolError(f"tool {call.tool_name.name} is not in this MCP toolbox")
        if self.needs_approval(call.tool_name) and approved.get() is not call:
            identifier = normalize_identifier(f"{call.tool_name.namespace}__{call.tool_name.name}")
            raise denial(identifier, NO_APPROVER)  # nobody approved it (docs/governance.md)
        try:
            arguments = arguments_of(call.tool_name.name, call.input)
        except TypeError as error:
            raise ToolError(str(error)) from None
        return result_value(await link.call(call.tool_name.name, arguments))

    async def notify(self, call_id: str, cell_id: CellId, text: str) -> None:
        """Hand a cell's `notify(text)` to `on_notify` (or log it at INFO)."""
        await deliver_notification(self._on_notify, cell_id, text, logger)

    def cell_closed(self, cell_id: CellId) -> None:
        """Nothing to release: MCP calls end with their cell's tasks."""

    def __repr__(self) -> str:
        return f"<McpToolbox of {', '.join(self._links) or 'no servers'}>"


@asynccontextmanager
async def open_mcp_toolbox(
    servers: Mapping[str, ServerSpec],
    *,
    on_notify: NotifyHandler | None = None,
    connect_timeout: float = CONNECT_TIMEOUT,
) -> AsyncIterator[McpToolbox]:
    """Connect to MCP servers and serve their tools to cells.

    Args:
        servers: server name -> a command (an argv list, or a string split like a shell does),
            a streamable HTTP URL (`http://...` or `https://...`), or an `McpServer`.
        on_notify: receives each cell's `notify(text)` as `on_notify(cell_id, text)`.
        connect_timeout: seconds each server may take to start and list its tools.

    Yields:
        The `McpToolbox`, connected to every server.

    Raises:
        ValueError: a server spec that does not parse.
        McpConnectionError: a server could not be started, reached or listed (the first such
            failure; the others are logged).

    Resource handling: on exit every connection is closed and every stdio server stopped
    (the SDK closes its stdin, then terminates it, bounded).
    """
    parsed = servers_from(servers)
    async with open_service_nursery() as nursery:
        toolbox: McpToolbox | None = None
        links: dict[str, ServerLink] = {}

        def changed() -> None:
            if toolbox is not None:
                toolbox._tools_changed()

        for name, server in parsed.items():
            links[name] = ServerLink(name, server, nursery, changed, connect_timeout)
        try:
            await _connect_all(links)
            toolbox = McpToolbox(links, on_notify)
            yield toolbox
        finally:
            for link in links.values():
                link.close()


async def _connect_all(links: dict[str, ServerLink]) -> None:
    failures: list[McpConnectionError] = []

    async def connect(link: ServerLink) -> None:
        try:
            await link.connect()
        except McpConnectionError as error:
            failures.append(error)

    async with trio.open_nursery() as nursery:
        for link in links.values():
            nursery.start_soon(connect, link)
    for extra in failures[1:]:
        logger.error("%s", extra)
    if failures:
        raise failures[0]
