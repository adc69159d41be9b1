"""Where an MCP server is: a command to start (stdio) or a streamable HTTP URL.

Rules:
1. A string starting with `http://` or `https://` is a URL; any other string is a command,
   split the way a POSIX shell splits it (`shlex.split`, no expansion); a list is an argv as is.
2. `--server NAME=VALUE` takes the text before the first `=` as the name.
3. A config file holds the usual `{"mcpServers": {name: entry}}`: an entry has a `command` (with
   optional `args`, `env`, `cwd`) or a `url` (with optional `headers`); its `type`, when
   present, must agree (`stdio`, or `http`/`streamable-http`).
4. Every mistake raises `ValueError` with a one-line text naming the server.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec


class McpServer(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How to reach one MCP server.

    Parameters:
        command: the argv of a server spoken to over its stdin and stdout.
        url: the endpoint of a streamable HTTP server.
        env: extra environment variables of the command (over the SDK's safe defaults).
        cwd: the working directory of the command.
        headers: extra HTTP headers (an `Authorization` header, say) sent to the URL.

    Exactly one of `command` and `url` is set.
    """

    command: list[str] | None = None
    url: str | None = None
    env: dict[str, str] | None = None
    cwd: str | None = None
    headers: dict[str, str] | None = None

    def __post_init__(self) -> None:
        if (self.command is None) == (self.url is None):
            raise ValueError("an MCP server needs either a command or a url")
        if self.command is not None and not self.command:
            raise ValueError("an MCP server command must not be empty")

    def describe(self) -> str:
        """The command line or the URL, for messages."""
        if self.command is not None:
            return shlex.join(self.command)
        return self.url or ""


ServerSpec = McpServer | str | Sequence[str]
"""What `open_mcp_toolbox` accepts for one server."""


def _is_url(text: str) -> bool:
    return text.startswith(("http://", "https://"))


def parse_server(spec: ServerSpec) -> McpServer:
    """The server `spec` names: an `McpServer`, a URL, a shell-style command or an argv.

    Raises:
        ValueError: an empty command, or a command that does not split (an open quote).
    """
    if isinstance(spec, McpServer):
        return spec
    if isinstance(spec, str):
        if _is_url(spec):
            return McpServer(url=spec)
        try:
            argv = shlex.split(spec)
        except ValueError as error:
            raise ValueError(f"cannot split the command {spec!r}: {error}") from None
        return McpServer(command=argv)
    return McpServer(command=list(spec))


def parse_named(text: str) -> tuple[str, McpServer]:
    """A `--server NAME=COMMAND_OR_URL` value.

    Raises:
        ValueError: no `=`, an empty name, or a value `parse_server` refuses.
    """
    name, equals, value = text.partition("=")
    if not equals or not name.strip():
        raise ValueError(f"--server expects NAME=COMMAND_OR_URL, got {text!r}")
    return name.strip(), parse_server(value)


def read_config(path: str | Path) -> dict[str, McpServer]:
    """The servers of an `mcpServers` JSON file (the format MCP clients share).

    Raises:
        ValueError: the file cannot be read, is not JSON, or holds an entry that is not a
            server (its text names the entry).
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror or error}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read {path}: not JSON ({error})") from None
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        raise ValueError(f"{path} has no `mcpServers` object")  # noqa: TRY004 (file content)
    return {str(name): _entry(path, str(name), entry) for name, entry in servers.items()}


def _entry(path: str | Path, name: str, entry: Any) -> McpServer:
    if not isinstance(entry, dict):
        raise ValueError(f"{path}: server {name!r} is not an object")  # noqa: TRY004
    entry = dict(entry)
    kind = entry.pop("type", None)
    if "command" in entry:
        if kind not in (None, "stdio"):
            raise ValueError(f"{path}: server {name!r} has a command but type {kind!r}")
        entry["command"] = [entry["command"], *entry.pop("args", [])]
    elif kind not in (None, "http", "streamable-http", "streamableHttp"):
        raise ValueError(f"{path}: server {name!r} has type {kind!r} (only stdio and http)")
    try:
        return msgspec.convert(entry, McpServer, strict=True)
    except msgspec.ValidationError as error:
        raise ValueError(f"{path}: server {name!r}: {error}") from None


def servers_from(
    servers: Mapping[str, ServerSpec],
) -> dict[str, McpServer]:
    """Each named spec parsed (rule 1).

    Raises:
        ValueError: an empty name, or a spec `parse_server` refuses.
    """
    parsed: dict[str, McpServer] = {}
    for name, spec in servers.items():
        if not name:
            raise ValueError("an MCP server name must not be empty")
        parsed[name] = parse_server(spec)
    return parsed
