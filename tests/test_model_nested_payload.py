"""The payload a nested call hands its tool (reference 3.12, tests of 9.9)."""

from __future__ import annotations

from typing import Any

import pytest

from codemode import NestedToolCall, ToolError, ToolKind, ToolName
from codemode.model import nested_tool_payload


def call(kind: ToolKind, value: Any, name: ToolName | None = None) -> NestedToolCall:
    return NestedToolCall(
        cell_id="1",
        runtime_tool_call_id="tool-1",
        tool_name=name or ToolName.plain("tool"),
        tool_kind=kind,
        input=value,
    )


def test_build_nested_tool_payload_uses_function_kind() -> None:
    assert nested_tool_payload(call(ToolKind.FUNCTION, {"value": 1})) == {"value": 1}
    assert nested_tool_payload(call(ToolKind.FUNCTION, None)) == {}


def test_build_nested_tool_payload_uses_freeform_kind() -> None:
    assert nested_tool_payload(call(ToolKind.FREEFORM, "*** Begin Patch")) == "*** Begin Patch"


@pytest.mark.parametrize(
    ("kind", "value", "name", "message"),
    [
        (ToolKind.FUNCTION, [1], ToolName.plain("lookup"), "tool `lookup` expects a JSON object for arguments"),
        (ToolKind.FUNCTION, "text", ToolName.namespaced("mcp__s__", "echo"), "tool `mcp__s__echo` expects a JSON object for arguments"),
        (ToolKind.FREEFORM, None, ToolName.plain("apply_patch"), "tool `apply_patch` expects a string input"),
        (ToolKind.FREEFORM, {"patch": "x"}, ToolName.plain("apply_patch"), "tool `apply_patch` expects a string input"),
    ],
)  # fmt: skip
def test_inputs_that_do_not_suit_the_kind_are_tool_errors(
    kind: ToolKind, value: Any, name: ToolName, message: str
) -> None:
    with pytest.raises(ToolError) as caught:
        nested_tool_payload(call(kind, value, name))
    assert caught.value.text == message
