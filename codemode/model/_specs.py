"""The `exec` and `wait` tool definitions handed to a model API (reference 7.1, 7.2, 9.9).

Rules:
1. OpenAI (Responses API): `exec` is a custom (freeform) tool whose input is constrained by the
   Lark grammar of reference 7.1 (an optional pragma line, then the source); `wait` is a function
   tool with `strict: false` and the parameters of reference 7.2.
2. Anthropic (Messages API): tools take JSON only, so `exec` takes `{"code": string}` and
   `wait` the same parameters as for OpenAI.
3. The specs are plain JSON-ready dicts, shaped exactly as each SDK's tool parameter type.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from .._api import ToolDefinition
from ._descriptions import (
    EXEC_TOOL_NAME,
    WAIT_TOOL_NAME,
    NamespaceDescription,
    exec_description,
    wait_description,
)

ModelApi = Literal["openai", "anthropic"]

EXEC_GRAMMAR = r"""
start: pragma_source | plain_source
pragma_source: PRAGMA_LINE NEWLINE SOURCE
plain_source: SOURCE

PRAGMA_LINE: /[ \t]*\/\/ @exec:[^\r\n]*/
NEWLINE: /\r?\n/
SOURCE: /[\s\S]+/
"""
"""The Lark grammar of the freeform `exec` input (reference 7.1)."""

WAIT_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "cell_id": {"type": "string", "description": "Identifier of the running exec cell."},
        "max_tokens": {
            "type": "number",
            "description": "Output token budget for this wait call. Defaults to 10000 tokens.",
        },
        "terminate": {
            "type": "boolean",
            "description": "True stops the running exec cell; false or omitted waits for output.",
        },
        "yield_time_ms": {
            "type": "number",
            "description": "Wait before yielding more output. Defaults to 10000 ms.",
        },
    },
    "required": ["cell_id"],
    "additionalProperties": False,
}
"""The JSON Schema of the `wait` arguments (reference 7.2)."""

EXEC_CODE_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "code": {
            "type": "string",
            "description": "Raw JavaScript source; its first line may be the `// @exec:` pragma.",
        }
    },
    "required": ["code"],
    "additionalProperties": False,
}
"""The JSON Schema of the `exec` input where a model API takes JSON only (Anthropic)."""


def tool_specs(
    api: ModelApi,
    tools: Iterable[ToolDefinition],
    *,
    namespace_descriptions: Mapping[str, NamespaceDescription] | None = None,
    deferred_tools_available: bool = False,
) -> list[dict[str, Any]]:
    """The `exec` and `wait` tool definitions for one model API, in that order.

    Args:
        api: `"openai"` (Responses API tools) or `"anthropic"` (Messages API tools).
        tools: the nested tools, as for `exec_description`.
        namespace_descriptions: headings keyed by `ToolName.namespace`.
        deferred_tools_available: add the guidance for tools left out of the description.

    Returns:
        Two fresh dicts (the caller may edit them), ready for the API's `tools` list.

    Raises:
        ValueError: an unknown `api`.
    """
    description = exec_description(
        tools,
        namespace_descriptions=namespace_descriptions,
        deferred_tools_available=deferred_tools_available,
    )
    if api == "openai":
        return [
            {
                "type": "custom",
                "name": EXEC_TOOL_NAME,
                "description": description,
                "format": {"type": "grammar", "syntax": "lark", "definition": EXEC_GRAMMAR},
            },
            {
                "type": "function",
                "name": WAIT_TOOL_NAME,
                "description": wait_description(),
                "strict": False,
                "parameters": copy.deepcopy(WAIT_PARAMETERS),
            },
        ]
    if api == "anthropic":
        return [
            {
                "name": EXEC_TOOL_NAME,
                "description": description,
                "input_schema": copy.deepcopy(EXEC_CODE_PARAMETERS),
            },
            {
                "name": WAIT_TOOL_NAME,
                "description": wait_description(),
                "input_schema": copy.deepcopy(WAIT_PARAMETERS),
            },
        ]
    raise ValueError(f"unknown model API {api!r}: expected 'openai' or 'anthropic'")
