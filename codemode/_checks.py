"""Checks of the application's requests that msgspec does not make at construction.

A `msgspec.Struct` checks its field types only when it is decoded, never when the application
builds one: `ToolDefinition(name=ToolName.plain("x"), ...)` constructs fine and used to fail
only on the host, as an undecodable frame. Every provider's session calls these checks first,
so a wrong request raises `InvalidRequestError` naming the field, the same way on every
provider, before anything is sent or started (docs/protocol.md, "Requests are checked twice").

What is checked: the type of every typed field, nested structs included; that every string is
well-formed Unicode (a lone surrogate has no UTF-8 form: the wire cannot carry it, the engine
cannot read it); that a schema is None, a boolean or a JSON object that encodes as JSON. The
numbers' bounds are the structs' own `__post_init__` checks, which run at construction.

Plain `type(...) is` tests on the hot path: a cell's request is checked once per execute, a few
dozen instructions per tool on first sight. A definition is checked once per object (its
schemas encoded as JSON then): an application hands the same definitions to every execute, so
the next check finds it in `_checked_tools`.
"""

from __future__ import annotations

from typing import NoReturn

import msgspec

from ._api import ExecuteRequest, ToolDefinition, ToolKind, ToolName, WaitRequest
from .errors import InvalidRequestError


def check_execute(request: object) -> None:
    """`request` is an `ExecuteRequest` whose every field has its declared type.

    Raises:
        InvalidRequestError: `invalid code-mode execute request: <field> ...`.
    """
    if type(request) is not ExecuteRequest:
        _wrong("execute request", "request", "an ExecuteRequest", request)
    tool_call_id = request.tool_call_id
    source = request.source
    if not (
        type(tool_call_id) is str
        and tool_call_id.isascii()
        and type(source) is str
        and source.isascii()
    ):
        _text("execute request", "tool_call_id", tool_call_id)
        _text("execute request", "source", source)
    tools = request.enabled_tools
    if type(tools) is not list:
        _wrong("execute request", "enabled_tools", "a list of ToolDefinition", tools)
    for index, tool in enumerate(tools):
        if _checked_tools.get(id(tool)) is not tool:
            _check_tool(f"enabled_tools[{index}]", tool)
    # The numbers' types and bounds: `ExecuteRequest.__post_init__`, at construction.


def check_wait(request: object) -> None:
    """`request` is a `WaitRequest` with a well-formed cell id and an integer window.

    Raises:
        InvalidRequestError: `invalid code-mode wait request: <field> ...`.
    """
    if type(request) is not WaitRequest:
        _wrong("wait request", "request", "a WaitRequest", request)
    _text("wait request", "cell_id", request.cell_id)
    if type(request.yield_time_ms) is not int:
        _wrong("wait request", "yield_time_ms", "an int", request.yield_time_ms)


def check_cell_id(cell_id: object) -> None:
    """`cell_id` (of `terminate`, `wait_to_pending`, `preempt`) is a well-formed string.

    Raises:
        InvalidRequestError: `invalid code-mode cell id: ...`.
    """
    if type(cell_id) is not str:
        raise InvalidRequestError(
            f"invalid code-mode cell id: expected a str, got {_name(cell_id)}"
        )
    _text("request", "cell_id", cell_id)


MAX_IDEMPOTENCY_KEY_LENGTH = 256
"""The longest idempotency key, in characters: ids and UUIDs fit many times over, and a session
keeps up to 1,024 of them (`_idempotency`)."""


def check_idempotency_key(key: object) -> None:
    """`key` (the `idempotency_key` of a session operation) is None or a str of 1 to
    `MAX_IDEMPOTENCY_KEY_LENGTH` characters. It never leaves the process, so any characters do.

    Raises:
        InvalidRequestError: `invalid code-mode request: idempotency_key ...`.
    """
    if key is None:
        return
    if type(key) is not str:
        _wrong("request", "idempotency_key", "None or a str", key)
    if not 0 < len(key) <= MAX_IDEMPOTENCY_KEY_LENGTH:
        raise InvalidRequestError(
            "invalid code-mode request: idempotency_key must be 1 to"
            f" {MAX_IDEMPOTENCY_KEY_LENGTH} characters long, got {len(key)}"
        )


def _check_tool(field: str, tool: object) -> None:
    """Check a definition not seen before; remember it (a frozen struct cannot change, but
    for the contents of its schemas, which the process client's encoder checks again)."""
    what = "execute request"
    if type(tool) is not ToolDefinition:
        _wrong(what, field, "a ToolDefinition", tool)
    _text(what, f"{field}.name", tool.name)
    tool_name = tool.tool_name
    if type(tool_name) is not ToolName:
        _wrong(what, f"{field}.tool_name", "a ToolName", tool_name)
    _text(what, f"{field}.tool_name.name", tool_name.name)
    if tool_name.namespace is not None:
        _text(what, f"{field}.tool_name.namespace", tool_name.namespace)
    _text(what, f"{field}.description", tool.description)
    if not isinstance(tool.kind, str) or tool.kind not in _KINDS:
        _wrong(what, f"{field}.kind", "a ToolKind", tool.kind)
    _check_schema(f"{field}.input_schema", tool.input_schema)
    _check_schema(f"{field}.output_schema", tool.output_schema)
    if len(_checked_tools) >= _CHECKED_TOOLS_MAX:
        _checked_tools.clear()
    _checked_tools[id(tool)] = tool


_KINDS = frozenset(kind.value for kind in ToolKind)
_CHECKED_TOOLS_MAX = 4096
_checked_tools: dict[int, object] = {}
"""Definitions that passed, by `id()`: an application hands the same definitions to every
execute, so a tool costs one lookup after its first. The value keeps the object alive, so its
id is never another object's while it is here."""


def _check_schema(field: str, schema: object) -> None:
    if schema is None or type(schema) is bool:
        return
    if type(schema) is not dict:
        _wrong("execute request", field, "a JSON object, a boolean or None", schema)
    try:
        msgspec.json.encode(schema)
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as error:
        raise InvalidRequestError(
            f"invalid code-mode execute request: {field} is not JSON: {error}"
        ) from None


def _text(what: str, field: str, value: object) -> None:
    if type(value) is not str:
        _wrong(what, field, "a str", value)
    if value.isascii():
        return
    try:
        value.encode()
    except UnicodeEncodeError as error:
        raise InvalidRequestError(
            f"invalid code-mode {what}: {field} holds a lone surrogate"
            f" ({value[error.start]!r} at index {error.start}), which has no UTF-8 form"
        ) from None


def _wrong(what: str, field: str, expected: str, value: object) -> NoReturn:
    raise InvalidRequestError(
        f"invalid code-mode {what}: {field} must be {expected}, got {_name(value)}"
    )


def _name(value: object) -> str:
    return type(value).__name__
