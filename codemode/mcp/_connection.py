"""One MCP server as the toolbox sees it: a connection opened on demand, its tools, its calls.

Rules:
1. The connection (the SDK's `Client`) lives in a task of the toolbox's nursery, entered and
   left by that one task (the SDK's task groups require it); callers borrow the client.
2. A connection that fails (the server process exited, the HTTP endpoint broke) is dropped
   when a call finds out: that call fails with a text saying so, and the next call starts a new
   connection. A failure to connect is reported the same way, at `open_mcp_toolbox` or at the
   call.
3. A `notifications/tools/list_changed` re-lists the tools in the connection's task (never in
   the SDK's message handler: its reply would have to be read by the very task waiting for it),
   then tells the toolbox.
4. Cancelling a call cancels its MCP request (the SDK sends `notifications/cancelled`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any

import mcp_types
import trio
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from ..errors import CodeModeError, ToolError
from ._servers import McpServer

logger = logging.getLogger("codemode.mcp")

MAX_TOOL_PAGES = 100
"""Pages of `tools/list` read at most: a server whose cursor never ends cannot hang us."""

CLIENT_INFO = mcp_types.Implementation(name="codemode", version="0.1")


class McpConnectionError(CodeModeError):
    """An MCP server could not be started or connected to (the text says which and why)."""


def _leaf(error: BaseException) -> BaseException:
    # anyio's task groups on trio wrap a transport's failure in exception groups; the message
    # the user needs is the first real error inside.
    while isinstance(error, BaseExceptionGroup):
        inner = [e for e in error.exceptions if not isinstance(e, trio.Cancelled)]
        if not inner:
            break
        error = inner[0]
    return error


def describe_error(error: BaseException) -> str:
    """`Type: message` of the error that matters, on one line."""
    leaf = _leaf(error)
    if isinstance(leaf, MCPError):
        return leaf.error.message
    text = " ".join(str(leaf).split())
    return f"{type(leaf).__name__}: {text}" if text else type(leaf).__name__


class ServerLink:
    """The connection to one MCP server and the tools it lists.

    Args:
        name: the server's name (`mcp__<name>__...`).
        server: how to reach it.
        nursery: the toolbox's nursery, which runs the connection's task.
        on_change: called (plain, on the trio thread) after a re-listing changed the tools.
        connect_timeout: seconds a connection (start, handshake, first listing) may take.
    """

    def __init__(
        self,
        name: str,
        server: McpServer,
        nursery: trio.Nursery,
        on_change: Callable[[], None],
        connect_timeout: float,
    ) -> None:
        self.name = name
        self.server = server
        self.tools: list[mcp_types.Tool] = []
        self.info: mcp_types.Implementation | None = None
        self._nursery = nursery
        self._on_change = on_change
        self._connect_timeout = connect_timeout
        self._lock = trio.Lock()
        self._client: Client | None = None
        self._stop = trio.Event()
        self._relist = trio.Event()
        self._closed = False

    async def _transport(self, stack: AsyncExitStack) -> Any:
        server = self.server
        if server.url is not None:
            # Entered here so that its sockets close with the connection, not at collection.
            http = await stack.enter_async_context(create_mcp_http_client(headers=server.headers))
            return streamable_http_client(server.url, http_client=http)
        assert server.command is not None
        return StdioServerParameters(
            command=server.command[0], args=server.command[1:], env=server.env, cwd=server.cwd
        )

    async def connect(self) -> Client:
        """The live client, connecting first if there is none.

        Raises:
            McpConnectionError: the server could not be started, reached or listed in time.
        """
        async with self._lock:
            if self._client is not None:
                return self._client
            if self._closed:
                raise McpConnectionError(f"the MCP toolbox is closed (server {self.name})")
            try:
                with trio.fail_after(self._connect_timeout):
                    client: Client = await self._nursery.start(self._run)
            except trio.TooSlowError:
                raise McpConnectionError(
                    f"MCP server {self.name} ({self.server.describe()}) did not answer within "
                    f"{self._connect_timeout:g} s"
                ) from None
            except Exception as error:
                raise McpConnectionError(
                    f"cannot connect to MCP server {self.name} ({self.server.describe()}): "
                    f"{describe_error(error)}"
                ) from error
            return client

    async def _run(self, task_status: trio.TaskStatus[Client] = trio.TASK_STATUS_IGNORED) -> None:
        stop = self._stop = trio.Event()
        started = False

        async def on_message(message: Any) -> None:
            if isinstance(message, mcp_types.ToolListChangedNotification):
                self._relist.set()

        try:
            async with AsyncExitStack() as stack:
                client = Client(
                    await self._transport(stack),
                    message_handler=on_message,
                    client_info=CLIENT_INFO,
                    cache=None,
                )
                await stack.enter_async_context(client)
                await self._list(client)
                self.info = client.server_info
                self._client = client
                started = True
                task_status.started(client)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._relist_forever, client)
                    nursery.start_soon(self._listen, client)
                    await stop.wait()
                    nursery.cancel_scope.cancel()
        except Exception as error:
            if not started:
                raise
            # Rule 2: the calls in flight saw it already; the next one reconnects.
            logger.warning("MCP server %s: connection ended: %s", self.name, describe_error(error))
        finally:
            if started and self._client is client:
                self._client = None

    async def _list(self, client: Client) -> None:
        tools: list[mcp_types.Tool] = []
        cursor: str | None = None
        for _ in range(MAX_TOOL_PAGES):
            page = await client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
        changed = tools != self.tools
        self.tools = tools
        if changed:
            self._on_change()

    async def _relist_forever(self, client: Client) -> None:
        while True:
            await self._relist.wait()
            self._relist = trio.Event()
            try:
                await self._list(client)
            except Exception as error:  # the next call finds the broken connection
                logger.warning("MCP server %s: cannot re-list tools: %s", self.name, error)

    async def _listen(self, client: Client) -> None:
        # The 2026-07-28 revision has no standing notification channel: a client asks for tool
        # changes with a `subscriptions/listen` stream. Handshake-era servers send
        # `notifications/tools/list_changed` to the message handler instead.
        if client.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return
        tools = client.server_capabilities.tools
        if tools is None or not tools.list_changed:
            return
        try:
            async with client.listen(tools_list_changed=True) as subscription:
                async for _event in subscription:
                    self._relist.set()
        except Exception as error:  # changes go unseen; calls still work
            logger.info("MCP server %s: tool-change stream ended: %s", self.name, error)

    def _drop(self, client: Client) -> None:
        if self._client is client:
            self._client = None
            self._stop.set()

    async def call(self, tool: str, arguments: dict[str, Any] | None) -> mcp_types.CallToolResult:
        """Call `tool` with `arguments`.

        Raises:
            ToolError: the server could not be reached, refused the request, or its connection
                broke (then the next call reconnects). A tool's own failure is no error: it is
                a result with `isError`.
        """
        try:
            client = await self.connect()
        except McpConnectionError as error:
            raise ToolError(str(error)) from error
        try:
            return await client.call_tool(tool, arguments)
        except MCPError as error:
            if error.code == mcp_types.CONNECTION_CLOSED:
                self._drop(client)
                again = "reconnected" if self.server.url is not None else "started again"
                raise ToolError(
                    f"MCP server {self.name} closed the connection before answering {tool} "
                    f"(did it exit?); it is {again} on the next call"
                ) from error
            raise ToolError(
                f"MCP server {self.name} refused {tool}: {error.error.message}"
            ) from error
        except Exception as error:
            self._drop(client)
            raise ToolError(
                f"MCP server {self.name} failed during {tool}: {describe_error(error)}; "
                "it is reconnected on the next call"
            ) from error

    def close(self) -> None:
        """End the connection's task (its transport closes the server, bounded by the SDK)."""
        self._closed = True
        self._stop.set()
