"""`codemode mcp serve`: code mode served to MCP clients, on stdio or streamable HTTP.

Rules:
1. The tools are the `--tools` toolboxes and the MCP servers of `--server` and `--config`
   (joined with `combine`); a server name given twice is a usage error.
2. On stdio, standard output carries MCP only (the SDK points file descriptor 1 at standard
   error while it serves); the server ends when the client closes standard input.
3. When an upstream server's tools change, the clients are told (`CodeModeService.tools_changed`).
4. With `--http`, the one line `codemode: serving MCP on <url>` goes to standard error once
   the socket listens; SIGINT or SIGTERM stops the server (both on stdio too).
5. On every way out, each client's session is shut down (its cells terminated), then the
   upstream MCP servers and the host process.
6. On stdio, a request the SDK's JSON parser refuses but that is JSON all the same (a lone
   surrogate escape, `"\\ud83d"`, which Python's `json` reads) is answered, not dropped: a
   `tools/call` with an `isError` result saying what is wrong, any other request with a
   JSON-RPC error (`INVALID_REQUEST`). The SDK hands the server such a line's parse error,
   which it drops unanswered, so the client would wait until its own timeout.
"""

from __future__ import annotations

import functools
import json
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

import mcp_types as types
import msgspec
import trio
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from .._cli_inputs import UsageError, load_tools
from .._combine import ToolSource, combine
from ._connection import McpConnectionError
from ._http import is_loopback, serve_http
from ._serve import CodeModeService, open_code_mode_service
from ._servers import McpServer, parse_named, read_config
from ._toolbox import McpToolbox, open_mcp_toolbox

CONNECT_FAILED = 1


class ServeOptions(msgspec.Struct, frozen=True, kw_only=True):
    """The options of `codemode mcp serve`.

    Parameters:
        servers: `--server NAME=COMMAND_OR_URL` values.
        config: the `--config` file, or None.
        tools: `--tools MODULE:ATTR` values.
        http: the `--http HOST:PORT` value, or None for stdio.
        token_file: the `--token-file` path, or None.
        in_process: run cells in this process rather than in a host process.
    """

    servers: list[str] = []
    config: str | None = None
    tools: list[str] = []
    http: str | None = None
    token_file: str | None = None
    in_process: bool = False


def upstream_servers(options: ServeOptions) -> dict[str, McpServer]:
    """The MCP servers named by `--config` and `--server` (rule 1).

    Raises:
        UsageError: a malformed value, an unreadable config, or a name given twice.
    """
    servers: dict[str, McpServer] = {}
    try:
        named = [] if options.config is None else list(read_config(options.config).items())
        named += [parse_named(value) for value in options.servers]
    except ValueError as error:
        raise UsageError(str(error)) from error
    for name, server in named:
        if name in servers:
            raise UsageError(f"MCP server {name} is given twice")
        servers[name] = server
    return servers


def http_address(value: str) -> tuple[str, int]:
    """`HOST:PORT` (an IPv6 host in brackets), checked.

    Raises:
        UsageError: no port, or a port that is not a number from 0 to 65535.
    """
    host, colon, port = value.rpartition(":")
    host = host.strip("[]")
    if not colon or not host or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"--http expects HOST:PORT (like 127.0.0.1:8765), got {value!r}")
    return host, int(port)


def read_token(path: str | None) -> str | None:
    """The bearer token in `--token-file` (surrounding whitespace removed).

    Raises:
        UsageError: the file cannot be read or holds no token.
    """
    if path is None:
        return None
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"cannot read the token file {path}: {error}") from error
    if not token or any(ch.isspace() for ch in token):
        raise UsageError(f"the token file {path} must hold one token, without spaces")
    return token


@asynccontextmanager
async def _open_upstream(servers: dict[str, McpServer]) -> AsyncIterator[McpToolbox | None]:
    if not servers:
        yield None
        return
    async with open_mcp_toolbox(servers) as toolbox:
        yield toolbox


async def _serve_stdio(service: CodeModeService) -> None:
    server = service.server()
    async with stdio_server() as (read, write):
        answering = AnsweringUnparsed(read, write)
        await server.run(answering, write, server.create_initialization_options())


class AnsweringUnparsed:
    """The stdio read stream, with the requests the SDK could not parse answered (rule 6).

    Args:
        read: the stream of `stdio_server`: messages, and the exceptions of lines that did not
            parse.
        write: where the answers go (the stream the server writes its own to).
    """

    def __init__(self, read: Any, write: Any) -> None:
        self._read = read
        self._write = write

    @property
    def last_context(self) -> Any:
        # The SDK runs each message's handler in the context its sender captured.
        return getattr(self._read, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        return await self._next(self._read.receive)

    def __aiter__(self) -> AnsweringUnparsed:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        return await self._next(self._read.__anext__)

    async def _next(self, get: Any) -> SessionMessage | Exception:
        """What `get()` gives next that is not a refused request this answered."""
        while True:
            item: SessionMessage | Exception = await get()
            if not (isinstance(item, Exception) and await self._answered(item)):
                return item

    async def aclose(self) -> None:
        await self._read.aclose()

    async def __aenter__(self) -> AnsweringUnparsed:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _answered(self, error: Exception) -> bool:
        request = unparsed_request(error)
        if request is None:
            return False  # not a request, or not JSON at all: the SDK's handling as before
        await self._write.send(SessionMessage(refusal(request)))
        return True


def unparsed_request(error: Exception) -> dict[str, Any] | None:
    """The request of a line the SDK's parser refused, when Python's `json` reads it."""
    if not isinstance(error, ValidationError):
        return None
    for detail in error.errors():
        line = detail.get("input")
        if detail["type"] != "json_invalid" or not isinstance(line, str):
            continue
        try:
            message = json.loads(line)
        except ValueError:
            return None
        if not isinstance(message, dict) or not isinstance(message.get("method"), str):
            return None
        request_id = message.get("id")
        if isinstance(request_id, bool) or not isinstance(request_id, int | str):
            return None  # a notification (no id) gets no answer
        return message
    return None


def refusal(request: dict[str, Any]) -> types.JSONRPCResponse | types.JSONRPCError:
    """The answer to `request`, whose JSON the SDK could not parse (rule 6)."""
    text = json.dumps(request, ensure_ascii=False)
    if any("\ud800" <= character <= "\udfff" for character in text):
        reason = (
            "the request holds a lone surrogate escape (like \\ud83d, half of a character), "
            "which is not Unicode text: send the whole character, or leave it out"
        )
    else:
        reason = "the request's JSON could not be parsed (a number or value out of range?)"
    if request["method"] == "tools/call":
        result = types.CallToolResult(content=[types.TextContent(text=reason)], is_error=True)
        return types.JSONRPCResponse(
            jsonrpc="2.0",
            id=request["id"],
            result=result.model_dump(by_alias=True, exclude_none=True, mode="json"),
        )
    return types.JSONRPCError(
        jsonrpc="2.0",
        id=request["id"],
        error=types.ErrorData(code=types.INVALID_REQUEST, message=reason),
    )


async def _forward_changes(upstream: McpToolbox, service: CodeModeService) -> None:
    while True:
        await upstream.wait_definitions_changed()
        await service.tools_changed()


async def _stop_on_signal(scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            scope.cancel(reason="signal")
            return


async def serve_main(options: ServeOptions) -> int:
    """Run `codemode mcp serve` until the client leaves or a signal stops it.

    Returns:
        The exit status: 0, or 1 when an upstream MCP server could not be reached.

    Raises:
        UsageError: a mistake in the options (before anything starts).
    """
    from .. import open_in_process_provider, open_process_provider

    python_tools = load_tools(options.tools)
    servers = upstream_servers(options)
    address = None if options.http is None else http_address(options.http)
    token = read_token(options.token_file)
    if address is not None and token is None and not is_loopback(address[0]):
        raise UsageError(
            f"refusing to serve on {address[0]} without --token-file: only a loopback address "
            "may be served without a bearer token"
        )
    open_provider = open_in_process_provider if options.in_process else open_process_provider
    try:
        async with open_provider() as provider, _open_upstream(servers) as upstream:
            sources: list[ToolSource] = [python_tools]
            namespaces = {}
            if upstream is not None:
                sources.append(upstream)
                namespaces = upstream.namespace_descriptions()
            try:
                tools = combine(*sources)
            except ValueError as error:
                raise UsageError(str(error)) from error
            async with (
                open_code_mode_service(provider, tools, namespaces) as service,
                trio.open_nursery() as nursery,
            ):
                nursery.start_soon(_stop_on_signal, nursery.cancel_scope)
                if upstream is not None:
                    nursery.start_soon(_forward_changes, upstream, service)
                if address is None:
                    await _serve_stdio(service)
                else:
                    host, port = address
                    serve = functools.partial(serve_http, token=token)
                    url = await nursery.start(serve, service, host, port)
                    print(f"codemode: serving MCP on {url}", file=sys.stderr, flush=True)
                    await trio.sleep_forever()
                nursery.cancel_scope.cancel()
    except McpConnectionError as error:
        print(f"codemode: {error}", file=sys.stderr)
        return CONNECT_FAILED
    return 0


def run(options: ServeOptions) -> int:
    """`trio.run` of `serve_main` (the command's entry)."""
    return trio.run(serve_main, options)
