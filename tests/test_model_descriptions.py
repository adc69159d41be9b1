"""The descriptions the model reads (reference 8.1-8.6, tests of 9.8): exact declarations."""

from __future__ import annotations

from typing import Any

import pytest

from codemode import (
    NamespaceDescription,
    ToolDefinition,
    ToolKind,
    ToolName,
    normalize_identifier,
    render_typescript,
)
from codemode.model import (
    MCP_TYPES,
    augment_tool_definition,
    exec_description,
    tool_declaration,
    wait_description,
)
from codemode.model._typescript import MAX_DEPTH

EMPTY_OBJECT = {"type": "object", "properties": {}, "additionalProperties": False}


def mcp_result_schema(structured: Any = None) -> dict[str, Any]:
    properties: dict[str, Any] = {
        "content": {"type": "array", "items": {"type": "object"}},
        "isError": {"type": "boolean"},
        "_meta": {"type": "object"},
    }
    if structured is not None:
        properties["structuredContent"] = structured
    return {
        "type": "object",
        "properties": properties,
        "required": ["content"],
        "additionalProperties": False,
    }


def mcp_tool(name: str, description: str, structured: Any = EMPTY_OBJECT) -> ToolDefinition:
    return ToolDefinition(
        name=f"mcp__sample__{name}",
        tool_name=ToolName.namespaced("mcp__sample__", name),
        description=description,
        input_schema=EMPTY_OBJECT,
        output_schema=mcp_result_schema(structured),
    )


def test_normalize_identifier_rewrites_invalid_characters() -> None:
    assert normalize_identifier("mcp__ologs__get_profile") == "mcp__ologs__get_profile"
    assert normalize_identifier("hidden-dynamic-tool") == "hidden_dynamic_tool"


@pytest.mark.parametrize(
    ("name", "identifier"),
    [
        ("", "_"),
        ("9lives", "_lives"),  # a leading digit is replaced, not prefixed
        ("a9", "a9"),
        ("$get_x", "$get_x"),
        ("caf\u00e9 menu", "caf__menu"),  # one `_` per character, not per byte
        ("\u0663d", "_d"),  # a non-ASCII digit is not an identifier character either
        ("weather.get", "weather_get"),
    ],
)
def test_normalize_identifier_edge_cases(name: str, identifier: str) -> None:
    assert normalize_identifier(name) == identifier


def test_augment_tool_definition_appends_typed_declaration() -> None:
    tool = ToolDefinition(
        name="hidden_dynamic_tool",
        tool_name=ToolName.plain("hidden_dynamic_tool"),
        description="Test tool",
        input_schema={
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
        output_schema={
            "type": "object",
            "properties": {"ok": {"type": "boolean"}},
            "required": ["ok"],
        },
    )
    assert augment_tool_definition(tool).description == (
        "Test tool\n\nexec tool declaration:\n```ts\ndeclare const tools: { "
        "hidden_dynamic_tool(args: { city: string; }): Promise<{ ok: boolean; }>; };\n```"
    )


def test_augment_tool_definition_includes_property_descriptions_as_comments() -> None:
    tool = ToolDefinition(
        name="weather_tool",
        tool_name=ToolName.plain("weather_tool"),
        description="Weather tool",
        input_schema={
            "type": "object",
            "properties": {
                "weather": {
                    "type": "array",
                    "description": "look up weather for a given list of locations",
                    "items": {
                        "type": "object",
                        "properties": {"location": {"type": "string"}},
                        "required": ["location"],
                    },
                }
            },
            "required": ["weather"],
        },
        output_schema={
            "type": "object",
            "properties": {
                "forecast": {"type": "string", "description": "human readable weather forecast"}
            },
            "required": ["forecast"],
        },
    )
    assert (
        "weather_tool(args: {\n"
        "  // look up weather for a given list of locations\n"
        "  weather: Array<{ location: string; }>;\n"
        "}): Promise<{\n"
        "  // human readable weather forecast\n"
        "  forecast: string;\n"
        "}>;"
    ) in augment_tool_definition(tool).description


def test_exact_declarations_of_reference_8_4() -> None:
    echo = ToolDefinition(
        name="mcp__rmcp__echo",
        tool_name=ToolName.namespaced("mcp__rmcp__", "echo"),
        input_schema={
            "type": "object",
            "properties": {"message": {"type": "string"}, "env_var": {"type": "string"}},
            "required": ["message"],
        },
        output_schema=mcp_result_schema(
            {
                "type": "object",
                "properties": {"echo": {"type": "string"}, "env": {"type": ["string", "null"]}},
                "required": ["echo", "env"],
                "additionalProperties": False,
            }
        ),
    )
    assert tool_declaration(echo) == (
        "mcp__rmcp__echo(args: { env_var?: string; message: string; }): "
        "Promise<CallToolResult<{ echo: string; env: string | null; }>>;"
    )
    assert tool_declaration(mcp_tool("alpha", "")) == (
        "mcp__sample__alpha(args: {}): Promise<CallToolResult<{}>>;"
    )
    view_image = ToolDefinition(
        name="view_image",
        tool_name=ToolName.plain("view_image"),
        input_schema={
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Local filesystem path to an image file."}
            },
            "required": ["path"],
            "additionalProperties": False,
        },
        output_schema={
            "type": "object",
            "properties": {
                "detail": {
                    "enum": ["high", "original"],
                    "description": "Image detail hint returned by view_image.",
                },
                "image_url": {"type": "string", "description": "Data URL for the loaded image."},
            },
            "required": ["detail", "image_url"],
            "additionalProperties": False,
        },
    )
    assert tool_declaration(view_image) == (
        "view_image(args: {\n  // Local filesystem path to an image file.\n  path: string;\n"
        '}): Promise<{\n  // Image detail hint returned by view_image.\n  detail: "high" | "original";\n'
        "  // Data URL for the loaded image.\n  image_url: string;\n}>;"
    )


def test_declarations_of_freeform_untyped_and_plain_mcp_tools() -> None:
    freeform = ToolDefinition(
        name="apply-patch", tool_name=ToolName.plain("apply_patch"), kind=ToolKind.FREEFORM
    )
    assert tool_declaration(freeform) == "apply_patch(input: string): Promise<unknown>;"
    untyped = ToolDefinition(name="ping", tool_name=ToolName.plain("ping"))
    assert tool_declaration(untyped) == "ping(args: unknown): Promise<unknown>;"
    # No structuredContent (the schema `true`) renders as the plain result type.
    plain = ToolDefinition(
        name="m", tool_name=ToolName.plain("m"), output_schema=mcp_result_schema()
    )
    assert tool_declaration(plain) == "m(args: unknown): Promise<CallToolResult>;"
    # Missing one of the MCP markers: an ordinary object.
    almost = mcp_result_schema()
    del almost["properties"]["_meta"]
    typed = ToolDefinition(name="m", tool_name=ToolName.plain("m"), output_schema=almost)
    assert tool_declaration(typed) == (
        "m(args: unknown): Promise<{ content: Array<{ [key: string]: unknown; }>; "
        "isError?: boolean; }>;"
    )


def test_exec_tool_is_never_augmented() -> None:
    tool = ToolDefinition(name="exec", tool_name=ToolName.plain("exec"), description="x")
    assert augment_tool_definition(tool) is tool


def test_code_mode_only_description_includes_nested_tools() -> None:
    description = exec_description(
        [ToolDefinition(name="foo", tool_name=ToolName.plain("foo"), description="bar")]
    )
    assert "### `foo`\nbar" in description
    assert description.endswith(
        "### `foo`\nbar\n\nexec tool declaration:\n```ts\n"
        "declare const tools: { foo(args: unknown): Promise<unknown>; };\n```"
    )


def test_exec_description_mentions_timeout_helpers() -> None:
    description = exec_description([])
    assert "`setTimeout(callback: () => void, delayMs?: number)`" in description
    assert "`clearTimeout(timeoutId?: number)`" in description


def test_exec_description_keeps_the_asserted_phrases() -> None:
    description = exec_description([])
    assert description.startswith("Run JavaScript code to orchestrate/compose tool calls\n")
    for phrase in (
        '`// @exec: {"yield_time_ms": 10000, "max_output_tokens": 1000}`',
        "`exit()`",
        "`text(value: string | number | boolean | undefined | null)`",
        '`image(imageUrlOrItem: string | { image_url: string; detail?: "auto" | "low" | "high" | '
        '"original" | null } | ImageContent, detail?: "auto" | "low" | "high" | "original" | null)`',
        "`generatedImage(result: { image_url: string; output_hint?: string })`",
        "`store(key: string, value: any)`",
        "`load(key: string)`",
        "`notify(value: string | number | boolean | undefined | null)`",
        "`ALL_TOOLS`",
        "`yield_control()`",
        "`await tools.exec_command(...)`",
        "`await tools.mcp__ologs__get_profile(...)`",
    ):
        assert phrase in description
    assert exec_description([]) == description  # no tools: the template alone
    assert "Shared MCP Types" not in description
    assert "deferred" not in description


def test_code_mode_only_description_groups_namespace_instructions_once() -> None:
    namespaces = {
        "mcp__sample__": NamespaceDescription(
            name="mcp__sample", description="Shared namespace guidance."
        )
    }
    description = exec_description(
        [mcp_tool("alpha", "First tool"), mcp_tool("beta", "Second tool")],
        namespace_descriptions=namespaces,
    )
    assert description.count("## mcp__sample") == 1
    assert "## mcp__sample\nShared namespace guidance." in description
    assert (
        "declare const tools: { mcp__sample__alpha(args: {}): Promise<CallToolResult<{}>>; };"
        in description
    )
    assert (
        "declare const tools: { mcp__sample__beta(args: {}): Promise<CallToolResult<{}>>; };"
        in description
    )


def test_namespace_headings_follow_changes_of_namespace() -> None:
    namespaces = {
        "a__": NamespaceDescription(name="a", description="About a."),
        "b__": NamespaceDescription(name="b", description="About b."),
    }
    tools = [
        ToolDefinition(name=name, tool_name=ToolName.namespaced(namespace, name))
        if namespace
        else ToolDefinition(name=name, tool_name=ToolName.plain(name))
        for namespace, name in [("a__", "a1"), ("b__", "b1"), ("", "plain"), ("a__", "a2")]
    ]
    description = exec_description(tools, namespace_descriptions=namespaces)
    blocks = description.split("\n\n")
    headings = [block for block in blocks if block.startswith("#")]
    assert [heading.split("\n")[0] for heading in headings] == [
        "## a",
        "### `a1`",
        "## b",
        "### `b1`",
        "### `plain`",
        "## a",
        "### `a2`",
    ]


def test_code_mode_only_description_omits_empty_namespace_sections() -> None:
    namespaces = {"mcp__sample__": NamespaceDescription(name="mcp__sample", description=" \n")}
    description = exec_description(
        [mcp_tool("alpha", "First tool")], namespace_descriptions=namespaces
    )
    assert "## mcp__sample" not in description
    assert "### `mcp__sample__alpha`" in description


def test_code_mode_only_description_renders_shared_mcp_types_once() -> None:
    echo = {
        "type": "object",
        "properties": {"echo": {"type": "string"}},
        "required": ["echo"],
        "additionalProperties": False,
    }
    count = {
        "type": "object",
        "properties": {"count": {"type": "integer"}},
        "required": ["count"],
        "additionalProperties": False,
    }
    description = exec_description(
        [mcp_tool("alpha", "First tool", echo), mcp_tool("beta", "Second tool", count)]
    )
    assert description.count("type CallToolResult<TStructured = { [key: string]: unknown }>") == 1
    assert description.count("Shared MCP Types:") == 1
    assert f"Shared MCP Types:\n```ts\n{MCP_TYPES}\n```\n\n### `mcp__sample__alpha`" in description
    assert "Promise<CallToolResult<{ count: number; }>>" in description
    for name in ("Role", "MetaObject", "Annotations", "Icon", "TextResourceContents"):
        assert f"type {name} = " in MCP_TYPES
    for name in ("BlobResourceContents", "TextContent", "ImageContent", "AudioContent"):
        assert f"type {name} = " in MCP_TYPES
    for name in ("ResourceLink", "EmbeddedResource", "ContentBlock"):
        assert f"type {name} =" in MCP_TYPES


def test_exec_description_mentions_deferred_nested_tools_when_available() -> None:
    description = exec_description([], deferred_tools_available=True)
    assert "Some deferred nested tools may be omitted" in description
    assert "filter `ALL_TOOLS` by `name` and `description`" in description
    assert "Some deferred" not in exec_description([], deferred_tools_available=False)


def test_wait_description() -> None:
    description = wait_description()
    assert description.startswith(
        "Waits on a yielded `exec` cell and returns new output or completion.\n- Use `wait` only "
        "after `exec` returns `Script running with cell ID ...`.\n"
    )
    assert description == description.strip()


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        (True, "unknown"),
        (False, "never"),
        (None, "unknown"),
        ({}, "unknown"),
        ({"const": "x"}, '"x"'),
        ({"const": {"a": 1}}, '{"a":1}'),
        ({"enum": ["a", 1, True, None]}, '"a" | 1 | true | null'),
        ({"enum": [], "type": "string"}, "string"),
        ({"anyOf": [{"type": "string"}, {"type": "number"}]}, "string | number"),
        ({"oneOf": [{"type": "integer"}, {"type": "null"}]}, "number | null"),
        ({"anyOf": [], "oneOf": [{"type": "boolean"}]}, "boolean"),
        ({"allOf": [{"type": "object", "properties": {"a": {}}}, {"required": ["b"]}]},
         "{ a?: unknown; } & { [key: string]: unknown; }"),
        ({"type": ["string", "null", 3]}, "string | null"),
        ({"type": [3], "items": {"type": "string"}}, "Array<string>"),
        ({"type": "frob"}, "unknown"),
        ({"type": "array"}, "unknown[]"),
        ({"type": "array", "items": True}, "Array<unknown>"),
        ({"prefixItems": [{"type": "string"}, {"type": "number"}]}, "[string, number]"),
        # A tuple with a rest element (2020-12): the prefix was dropped for `Array<number>`.
        ({"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "number"}},
         "[string, ...Array<number>]"),
        ({"prefixItems": [{"type": "string"}], "items": {"anyOf": [{"type": "number"}, {"type": "null"}]}},
         "[string, ...Array<number | null>]"),
        ({"prefixItems": [{"type": "string"}], "items": False}, "[string]"),
        ({"prefixItems": [], "items": {"type": "number"}}, "Array<number>"),
        ({"type": "array", "items": [{"type": "string"}, {"type": "null"}]}, "[string, null]"),
        ({"items": [{"type": "string"}], "additionalItems": {"type": "number"}},
         "[string, ...Array<number>]"),
        ({"type": "object"}, "{ [key: string]: unknown; }"),
        ({"type": "object", "additionalProperties": False}, "{}"),
        ({"type": "object", "additionalProperties": {"type": "number"}}, "{ [key: string]: number; }"),
        ({"properties": {"b": {}, "a-b": {"type": "string"}, "$x": {}}, "required": ["b", 3]},
         '{ $x?: unknown; "a-b"?: string; b: unknown; }'),
        ({"properties": {"a": {}}, "additionalProperties": True},
         "{ a?: unknown; [key: string]: unknown; }"),
    ],
)  # fmt: skip
def test_render_typescript_rules(schema: Any, expected: str) -> None:
    assert render_typescript(schema) == expected


def test_render_typescript_multi_line_objects() -> None:
    schema = {
        "type": "object",
        "properties": {
            "b": {"type": "string", "description": "  first line\n\n  second line  \r\n"},
            "a": {"type": "object", "properties": {"x": {"type": "number", "description": "x"}}},
        },
        "additionalProperties": {"type": "boolean"},
    }
    assert render_typescript(schema) == (
        "{\n  a?: {\n  // x\n  x?: number;\n};\n  // first line\n  // second line\n  b?: string;\n"
        "  [key: string]: boolean;\n}"
    )


def test_render_typescript_expands_local_refs_a_bounded_number_of_times() -> None:
    tree = {
        "$defs": {
            "Node": {
                "type": "object",
                "properties": {
                    "value": {"type": "number"},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
                },
                "required": ["value"],
            }
        },
        "type": "object",
        "properties": {"root": {"$ref": "#/$defs/Node"}},
    }
    assert render_typescript(tree) == (
        "{ root?: { children?: Array<{ children?: Array<unknown>; value: number; }>; "
        "value: number; }; }"
    )
    # A sibling reached through another path is expanded again: the bound is per path.
    pair = {
        "definitions": {"Leaf": {"type": "string"}},
        "properties": {
            "left": {"$ref": "#/definitions/Leaf"},
            "right": {"$ref": "#/definitions/Leaf"},
        },
    }
    assert render_typescript(pair) == "{ left?: string; right?: string; }"


def _nested(depth: int, leaf: Any, wrap: Any) -> Any:
    schema = leaf
    for _ in range(depth):
        schema = wrap(schema)
    return schema


def test_render_typescript_stops_at_max_depth() -> None:
    # A 2,000-deep schema raised RecursionError (exec description, `mcp serve` tools/list).
    def array(inner: Any) -> Any:
        return {"type": "array", "items": inner}

    assert render_typescript(_nested(MAX_DEPTH, {"type": "string"}, array)) == (
        "Array<" * MAX_DEPTH + "unknown" + ">" * MAX_DEPTH
    )
    assert render_typescript(_nested(MAX_DEPTH - 1, {"type": "string"}, array)) == (
        "Array<" * (MAX_DEPTH - 1) + "string" + ">" * (MAX_DEPTH - 1)
    )
    for wrap in (
        array,
        lambda inner: {"anyOf": [inner, {"type": "null"}]},
        lambda inner: {"type": "object", "properties": {"a": inner}},
        lambda inner: {"$ref": "#/$defs/x", "$defs": {"x": inner}},
        lambda inner: {"const": [inner]},
    ):
        rendered = render_typescript(_nested(2_000, {"type": "string"}, wrap))
        assert "unknown" in rendered


@pytest.mark.parametrize(
    "schema",
    [
        True, False, {}, {"type": "array", "items": False}, {"type": ["string", "null"]},
        {"const": {"a": [1, "x"]}}, {"enum": ['a"b', "c\nd", None, 1.5, True]},
        {"type": "object", "properties": {"a-b": {}, "": {}, "x\ny": {}, "'q'": {}}},
        {"type": "object", "properties": {"a": {"type": "string", "description": "x\n*/ }; //"}}},
        {"$ref": "#/$defs/Nope"}, {"$ref": "https://example.com/schema.json"},
        {"$defs": {"N": {"type": "object", "properties": {"next": {"$ref": "#/$defs/N"}}}}, "$ref": "#/$defs/N"},
        {"type": "object", "patternProperties": {"^x": {"type": "integer"}}},
        {"not": {"type": "string"}}, {"if": {"type": "string"}, "then": {"minLength": 1}},
        {"type": "string", "nullable": True}, {"type": "object", "properties": [1, 2]},
        {"type": "object", "properties": {"a": {}}, "required": "a"}, {"type": "decimal"},
        {"const": {1, 2}}, {"enum": [object()]}, {"const": 2**70}, {"items": None},
        {"prefixItems": "x", "items": 3}, {"description": 3, "properties": {"a": {"description": ["x"]}}},
    ],
)  # fmt: skip
def test_render_typescript_never_raises_on_odd_schemas(schema: Any) -> None:
    assert isinstance(render_typescript(schema), str)


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": "object", "properties": {"next": {"$ref": "#"}}},
         "{ next?: { next?: { next?: unknown; }; }; }"),
        ({"$ref": "#/$defs/a~1b~0c", "$defs": {"a/b~c": {"type": "string"}}}, "string"),
        ({"$ref": "#/$defs/with%20space", "$defs": {"with space": {"type": "number"}}}, "number"),
        ({"$ref": "#/$defs/list/1", "$defs": {"list": [{}, {"type": "boolean"}]}}, "boolean"),
        ({"$ref": "#/$defs/missing", "$defs": {}}, "unknown"),
        ({"$ref": "https://example.com/schema"}, "unknown"),
        ({"$ref": "#anchor"}, "unknown"),
        ({"$ref": 3, "type": "string"}, "string"),
        ({"$ref": "#/$defs/L", "enum": ["A"], "$defs": {"L": {"type": "string"}}}, '(string) & ("A")'),
        ({"$ref": "#/$defs/L", "description": "d", "$defs": {"L": {"type": "string"}}}, "string"),
        ({"$ref": "#/$defs/L", "type": "string", "$defs": {"L": {}}}, "string"),
        ({"$ref": "#/$defs/L", "title": "t", "items": {}, "$defs": {"L": {"type": "null"}}},
         "(null) & (Array<unknown>)"),
    ],
)  # fmt: skip
def test_render_typescript_refs(schema: Any, expected: str) -> None:
    assert render_typescript(schema) == expected
