"""Code mode over streamable HTTP: hypercorn on trio, `Origin` checks and a bearer token.

Rules:
1. The endpoint is `http://HOST:PORT/mcp`, served by hypercorn's trio worker (no asyncio).
2. DNS rebinding: the `Host` header must name the address served (any port for a loopback
   address) and an `Origin` header, when a browser sends one, must be an `http(s)://` origin of
   that host; anything else gets 403 (the SDK's transport-security check).
3. A client's `DELETE` of its MCP session (which the SDK's client sends when it closes) that
   succeeds ends its code-mode session too.
4. With a token, every request must carry `Authorization: Bearer <token>` (compared in constant
   time) or gets 401 before it reaches MCP. A non-loopback address is refused without a token:
   anyone who can reach the port could otherwise run code and call the tools.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from mcp.server.transport_security import TransportSecuritySettings

from ._serve import CodeModeService

logger = logging.getLogger("codemode.mcp")

PATH = "/mcp"
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address) only reaches this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def security_settings(host: str) -> TransportSecuritySettings:
    """The `Host`/`Origin` checks for a server bound to `host` (rule 2)."""
    names = LOOPBACK_NAMES if is_loopback(host) else (f"[{host}]" if ":" in host else host,)
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[f"{name}:*" for name in names],
        allowed_origins=[f"{scheme}://{name}:*" for name in names for scheme in ("http", "https")],
    )


class SessionEnd:
    """ASGI middleware: a successful `DELETE` of an MCP session ends its code-mode session."""

    def __init__(self, app: App, service: CodeModeService) -> None:
        self._app = app
        self._service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "DELETE":
            await self._app(scope, receive, send)
            return
        session_id = dict(scope.get("headers") or []).get(b"mcp-session-id", b"").decode()
        status = 0

        async def watch(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        await self._app(scope, receive, watch)
        if session_id and 200 <= status < 300:
            await self._service.end_connection(session_id)


class BearerToken:
    """ASGI middleware: HTTP requests without the right bearer token get 401 (rule 4)."""

    def __init__(self, app: App, token: str) -> None:
        self._app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                body = json.dumps({"error": "missing or wrong bearer token"}).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"www-authenticate", b"Bearer"),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self._app(scope, receive, send)


async def serve_http(
    service: CodeModeService,
    host: str,
    port: int,
    *,
    token: str | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `service` over streamable HTTP until cancelled.

    Args:
        service: the code-mode service.
        host: the address to bind (a loopback one unless `token` is given).
        port: the port (0: any free port).
        token: the bearer token every request must carry, or None.
        task_status: started with the endpoint's URL once the socket listens.

    Raises:
        ValueError: a non-loopback `host` without a token.
    """
    if token is None and not is_loopback(host):
        raise ValueError(
            f"refusing to serve on {host} without --token-file: only a loopback address "
            "(127.0.0.1, ::1, localhost) may be served without a bearer token"
        )
    server = service.server()
    app: Any = server.streamable_http_app(
        streamable_http_path=PATH, host=host, transport_security=security_settings(host)
    )
    app = SessionEnd(app, service)
    if token is not None:
        app = BearerToken(app, token)
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = logger
    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(_serve, app, config)
        task_status.started(f"{binds[0]}{PATH}")


async def _serve(
    app: Any, config: Config, *, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED
) -> None:
    # hypercorn's own `serve`, adapted to `nursery.start` (it takes task_status by keyword).
    await serve(app, config, task_status=task_status)
