"""What the framework integrations share: the code mode of a session on either event loop.

Rules:
1. A `codemode.aio.Session` gets a `codemode.aio.CodeMode` (the framework runs on asyncio), a
   `codemode.Session` a `codemode.CodeMode` (it runs on trio): the integrations are written once
   against what both have (`call`, the descriptions, the tool specs).
2. The framework's own tools reach the cells as nested tools: their names, descriptions and
   JSON Schemas become `codemode.ToolDefinition`s, and a call goes to the framework's tool,
   its result converted to JSON.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from pydantic_core import to_jsonable_python

import codemode
import codemode.aio
from codemode import JsonValue, ToolDefinition, ToolName, ToolOutput


class AnyCodeMode(Protocol):
    """What `codemode.CodeMode` and `codemode.aio.CodeMode` both have (rule 1)."""

    def exec_description(self) -> str: ...

    def wait_description(self) -> str: ...

    def tool_specs(self, api: Any) -> list[dict[str, Any]]: ...

    async def call(self, name: str, call_id: str, payload: Any) -> ToolOutput: ...


def code_mode_of(
    session: codemode.Session | codemode.aio.Session,
    delegate: codemode.SessionDelegate,
    tools: Iterable[ToolDefinition],
    options: dict[str, Any],
) -> AnyCodeMode:
    """The code mode of `session`, for its event loop (rule 1)."""
    if isinstance(session, codemode.aio.Session):
        return codemode.aio.CodeMode(session, delegate, tools, **options)
    return codemode.CodeMode(session, delegate, tools, **options)


def nested_definition(name: str, description: str | None, schema: dict[str, Any]) -> ToolDefinition:
    """A framework tool as a nested tool of the cells (rule 2)."""
    return ToolDefinition(
        name=name,
        tool_name=ToolName.plain(name),
        description=description or "",
        input_schema=schema,
    )


def as_json(value: Any) -> JsonValue:
    """A framework tool's result as the JSON value the cell gets."""
    result: JsonValue = to_jsonable_python(value)
    return result


def exec_schema(code_mode: AnyCodeMode) -> tuple[dict[str, Any], dict[str, Any]]:
    """The JSON Schemas of `exec` (`{"code": ...}`) and `wait`, as the Messages API shapes them:
    what a framework's function tools take."""
    exec_spec, wait_spec = code_mode.tool_specs("anthropic")
    return exec_spec["input_schema"], wait_spec["input_schema"]
