"""What the model reads about the `exec` and `wait` tools (reference 8.1-8.4).

Rules:
1. Code mode is the only way the model reaches the nested tools, so the exec description always
   lists them (the reference's "code-mode-only" form): the exec text, the deferred-tools
   guidance when asked for, the shared MCP types once if any tool returns an MCP result, then
   one block per tool under its namespace's heading.
2. A tool's block is its heading (``### `identifier` ``, with the raw name beside it when the two
   differ) and its sample: its description, then its TypeScript declaration.
3. The cell's `ALL_TOOLS` shows the same sample as each tool's description
   (`augment_tool_definition`); the `exec` tool itself is never augmented.
4. The texts are our own words; the phrases the reference's tests assert are kept verbatim
   (helper signatures, the pragma example, the deferred-tools guidance, the wait texts).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from .._api import ToolDefinition, ToolKind
from .._identifiers import normalize_identifier
from ._mcp_types import MCP_TYPES, is_mcp_result_schema, structured_content_schema
from ._typescript import render_typescript

EXEC_TOOL_NAME = "exec"
WAIT_TOOL_NAME = "wait"

EXEC_TEXT = """\
Run JavaScript code to orchestrate/compose tool calls
- The code runs as an async ES module (top-level `await` works) in a fresh QuickJS context. \
Nothing in memory outlives the call except what you `store(...)`.
- Every nested tool is a method of the global `tools` object, for example \
`await tools.exec_command(...)`. Tool names become JavaScript identifiers (any character other \
than a letter, a digit, `_` or `$` turns into `_`), for example \
`await tools.mcp__ologs__get_profile(...)`.
- A nested tool method takes one argument: an object, or a string for the tools declared with \
`input: string`.
- A nested tool resolves to an object or a string, as its declaration below says.
- Only plain JavaScript is available: no Node, no file system, no network access, no console, \
no imports.
- Send raw JavaScript source text, not JSON, quoted strings, or markdown code fences.
- The first line may be a pragma like \
`// @exec: {"yield_time_ms": 10000, "max_output_tokens": 1000}`.
- `yield_time_ms` asks `exec` to yield early if the script is still running. Defaults to \
10000 ms.
- `max_output_tokens` sets the token budget for direct `exec` results. Defaults to 10000 tokens.
- The script ends when its top-level code has finished: promises nobody awaited and timeouts \
still pending are silently discarded.

Global helpers:
- `exit()`: ends the script at once, successfully (like a `return` at the top level).
- `text(value: string | number | boolean | undefined | null)`: appends a text item. Values \
that are not strings are written with `JSON.stringify(...)` when possible.
- `image(imageUrlOrItem: string | { image_url: string; detail?: "auto" | "low" | "high" | \
"original" | null } | ImageContent, detail?: "auto" | "low" | "high" | "original" | null)`: \
appends an image item from a base64 `data:` URL. To pass on an image an MCP tool returned, give \
one `ImageContent` block of `result.content`, for example `image(result.content[0])`; such a \
block may ask for a detail with `_meta: { "codex/imageDetail": "original" }`. A second \
`detail` argument overrides any detail the first one carries.
- `generatedImage(result: { image_url: string; output_hint?: string })`: appends an \
image-generation result, then its output hint if it has one. HTTP(S) URLs are not supported.
- `store(key: string, value: any)`: keeps a JSON-serializable value under a string key for \
later `exec` calls of this session.
- `load(key: string)`: the value stored under a string key, or `undefined` if there is none.
- `notify(value: string | number | boolean | undefined | null)`: immediately sends an extra \
message about the current `exec` call, outside its output. Values are converted like \
`text(...)`.
- `setTimeout(callback: () => void, delayMs?: number)`: runs a callback later and returns its \
timeout id. Pending timeouts do not keep `exec` alive; to wait, await a promise such as \
`await new Promise((resolve) => setTimeout(resolve, 1000))`.
- `clearTimeout(timeoutId?: number)`: cancels a timeout made by `setTimeout`.
- `ALL_TOOLS`: the enabled nested tools, as `{ name, description }` entries.
- `yield_control()`: hands the output so far to the model at once while the script keeps \
running."""
"""The exec template (reference 8.2), in our words."""

DEFERRED_TOOLS_TEXT = """\
Some deferred nested tools may be omitted from this description. They are still available on \
the global `tools` object and listed in `ALL_TOOLS`.
To find one, filter `ALL_TOOLS` by `name` and `description`."""
"""The deferred-tools guidance, verbatim from the reference."""

WAIT_TEXT = """\
- Use `wait` only after `exec` returns `Script running with cell ID ...`.
- `cell_id` names the running `exec` cell to resume.
- `yield_time_ms` is how long to wait for more output before yielding again. Defaults to \
10000 ms.
- `max_tokens` is the token budget of the output this call returns. Defaults to 10000 tokens.
- `terminate: true` stops the running cell; false or omitted waits for output.
- `wait` returns only the output produced since the last yield, or the final completion or \
termination result of the cell.
- If the cell is still running, `wait` may yield again with the same `cell_id`.
- If the cell has already finished, `wait` returns the completed result and closes the cell."""
"""The wait template (reference 8.2), in our words."""


class NamespaceDescription(msgspec.Struct, frozen=True, kw_only=True):
    """The heading shown above the tools of one namespace in the exec description.

    Parameters:
        name: the heading (`## {name}`); consecutive tools whose namespaces share it share
            one heading.
        description: the guidance under the heading; blank means no heading at all.
    """

    name: str
    description: str


def tool_declaration(tool: ToolDefinition) -> str:
    """The TypeScript signature of a tool on the `tools` object (reference 8.4).

    >>> from codemode import ToolName
    >>> tool_declaration(ToolDefinition(name="ping", tool_name=ToolName.plain("ping")))
    'ping(args: unknown): Promise<unknown>;'
    """
    if tool.kind is ToolKind.FREEFORM:
        parameter = "input: string"
    elif tool.input_schema is None:
        parameter = "args: unknown"
    else:
        parameter = f"args: {render_typescript(tool.input_schema)}"
    if is_mcp_result_schema(tool.output_schema):
        structured = render_typescript(structured_content_schema(tool.output_schema))
        result = "CallToolResult" if structured == "unknown" else f"CallToolResult<{structured}>"
    elif tool.output_schema is None:
        result = "unknown"
    else:
        result = render_typescript(tool.output_schema)
    return f"{normalize_identifier(tool.name)}({parameter}): Promise<{result}>;"


def tool_sample(tool: ToolDefinition) -> str:
    """A tool's description followed by its declaration, as `ALL_TOOLS` and the exec
    description show it."""
    declaration = f"declare const tools: {{ {tool_declaration(tool)} }};"
    return f"{tool.description}\n\nexec tool declaration:\n```ts\n{declaration}\n```"


def augment_tool_definition(tool: ToolDefinition) -> ToolDefinition:
    """`tool` with its description replaced by its sample (the `exec` tool unchanged)."""
    if tool.name == EXEC_TOOL_NAME:
        return tool
    return msgspec.structs.replace(tool, description=tool_sample(tool))


def _heading(tool: ToolDefinition) -> str:
    identifier = normalize_identifier(tool.name)
    if identifier == tool.name:
        return f"### `{identifier}`"
    return f"### `{identifier}` (`{tool.name}`)"


def _tool_blocks(
    tools: Iterable[ToolDefinition], namespaces: Mapping[str, NamespaceDescription]
) -> list[str]:
    blocks: list[str] = []
    current: str | None = None
    for tool in tools:
        namespace = tool.tool_name.namespace
        description = namespaces.get(namespace) if namespace is not None else None
        name = description.name if description is not None else None
        if name != current:
            if description is not None and description.description.strip():
                blocks.append(f"## {description.name}\n{description.description.strip()}")
            current = name
        sample = tool_sample(tool).strip()
        blocks.append(f"{_heading(tool)}\n{sample}" if sample else _heading(tool))
    return blocks


def exec_description(
    tools: Iterable[ToolDefinition],
    *,
    namespace_descriptions: Mapping[str, NamespaceDescription] | None = None,
    deferred_tools_available: bool = False,
) -> str:
    """The description of the `exec` tool, with the declarations of the nested tools.

    Args:
        tools: the nested tools, in the order the cell's `ALL_TOOLS` lists them, with their
            own descriptions (not yet augmented).
        namespace_descriptions: headings keyed by `ToolName.namespace`.
        deferred_tools_available: add the guidance for tools left out of this description.

    Returns:
        The sections of reference 8.1 joined by blank lines.
    """
    tools = list(tools)
    sections = [EXEC_TEXT]
    if deferred_tools_available:
        sections.append(DEFERRED_TOOLS_TEXT)
    if any(is_mcp_result_schema(tool.output_schema) for tool in tools):
        sections.append(f"Shared MCP Types:\n```ts\n{MCP_TYPES}\n```")
    if tools:
        sections.append("\n\n".join(_tool_blocks(tools, namespace_descriptions or {})))
    return "\n\n".join(sections)


def wait_description() -> str:
    """The description of the `wait` tool: its first line, then the wait template."""
    return (
        f"Waits on a yielded `{EXEC_TOOL_NAME}` cell and returns new output or completion.\n"
        f"{WAIT_TEXT.strip()}"
    )
