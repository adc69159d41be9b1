"""MCP tools as code-mode tools, and MCP tool results as the values cells receive.

Rules:
1. The tool `t` of the server `s` is the nested tool `mcp__s__t` (reference 8.2), routed by
   `ToolName.namespaced("mcp__s", t)`; its JavaScript identifier is the name normalised (so
   `get-sum` of `everything` is `tools.mcp__everything__get_sum`).
2. Its output schema is an MCP `CallToolResult` whose `structuredContent` is the tool's own
   output schema, so its declaration reads `Promise<CallToolResult<...>>` and the shared MCP
   types are printed once (reference 8.5).
3. A result reaches JavaScript as the `CallToolResult` object: `content`, `isError` (always
   present), and `structuredContent` and `_meta` when the server sent them. `isError: true` is a
   value the cell inspects, not a rejection.
"""

from __future__ import annotations

from typing import Any

import mcp_types

from .._api import JsonValue, ToolDefinition, ToolName
from ..model import NamespaceDescription

PREFIX = "mcp__"


def namespace(server: str) -> str:
    """The `ToolName.namespace` of a server's tools."""
    return f"{PREFIX}{server}"


def result_schema(output_schema: dict[str, Any] | None) -> dict[str, Any]:
    """The JSON Schema of a `CallToolResult` carrying `output_schema` as structured content."""
    properties: dict[str, Any] = {
        "content": {"type": "array", "items": {"type": "object"}},
        "isError": {"type": "boolean"},
        "_meta": {"type": "object"},
    }
    if output_schema is not None:
        properties["structuredContent"] = output_schema
    return {"type": "object", "properties": properties, "required": ["content"]}


def tool_definition(server: str, tool: mcp_types.Tool) -> ToolDefinition:
    """The code-mode definition of one MCP tool (rules 1 and 2)."""
    description = tool.description or tool.title or ""
    return ToolDefinition(
        name=f"{PREFIX}{server}__{tool.name}",
        tool_name=ToolName.namespaced(namespace(server), tool.name),
        description=description.strip(),
        input_schema=dict(tool.input_schema),
        output_schema=result_schema(
            None if tool.output_schema is None else dict(tool.output_schema)
        ),
    )


def namespace_description(
    server: str, info: mcp_types.Implementation | None
) -> NamespaceDescription:
    """The heading above a server's tools in the exec description."""
    title = None if info is None else (info.title or info.name)
    about = f" ({title})" if title and title != server else ""
    return NamespaceDescription(
        name=f"MCP server `{server}`",
        description=f"Tools of the MCP server `{server}`{about}; each resolves to a "
        "`CallToolResult`, with `isError: true` when the tool failed.",
    )


def result_value(result: mcp_types.CallToolResult) -> JsonValue:
    """The `CallToolResult` object the cell receives (rule 3)."""
    value: dict[str, Any] = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    # Protocol bookkeeping of the 2026 revision, not part of the result the reference shows.
    value.pop("resultType", None)
    value["isError"] = bool(result.is_error)
    return value


def arguments_of(tool: str, value: JsonValue) -> dict[str, Any] | None:
    """The `arguments` of an MCP call from the cell's argument.

    Raises:
        TypeError: the cell passed something other than an object (or nothing).
    """
    if value is None or isinstance(value, dict):
        return value
    raise TypeError(f"MCP tool {tool} takes an object argument, got {type(value).__name__}")
