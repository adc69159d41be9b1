"""The payload a nested tool call hands its tool, checked like the reference host (3.12, 9.9).

Rules:
1. A function tool takes a JSON object: no input at all means `{}`; anything but an object is
   refused with ``tool `{name}` expects a JSON object for arguments``.
2. A freeform tool takes text: anything but a string is refused with
   ``tool `{name}` expects a string input``.
3. `{name}` is the routing name, its namespace written in front (`mcp__sample__` + `alpha`).

A refusal is a `ToolError`, so a delegate that lets it escape rejects the JS promise with
exactly that text.
"""

from __future__ import annotations

from typing import Any

from .._api import NestedToolCall, ToolKind
from ..errors import ToolError


def nested_tool_payload(call: NestedToolCall) -> dict[str, Any] | str:
    """The arguments object (function tools) or the text (freeform tools) of a nested call.

    Args:
        call: the call a cell made, as the delegate received it.

    Returns:
        A dict for a function tool, a str for a freeform tool.

    Raises:
        ToolError: the input does not suit the tool's kind (module rules).
    """
    name = f"{call.tool_name.namespace or ''}{call.tool_name.name}"
    if call.tool_kind is ToolKind.FREEFORM:
        if isinstance(call.input, str):
            return call.input
        raise ToolError(f"tool `{name}` expects a string input")
    if call.input is None:
        return {}
    if isinstance(call.input, dict):
        return call.input
    raise ToolError(f"tool `{name}` expects a JSON object for arguments")
