"""`CodeMode` end to end on both providers: nested tools, `ALL_TOOLS` and images, the tests
of reference 9.10 that are about them, by name."""

from __future__ import annotations

import json

import trio

from codemode import (
    ImageDetail,
    InputImage,
    JsonValue,
    NamespaceDescription,
    NestedToolCall,
    ToolDefinition,
    ToolError,
    ToolKind,
    ToolName,
)
from codemode.model import IMAGE_OMITTED, augment_tool_definition, nested_tool_payload
from tests.conftest import Provider
from tests.delegates import RecordingDelegate
from tests.sessions import tool
from tests.test_model_code_mode import body, open_code_mode, status_line
from tests.test_model_images import decoded_size, png_bytes, png_data_url


async def test_code_mode_can_return_exec_command_output(provider: Provider) -> None:
    result = {"chunk_id": "c1", "output": "hi\n", "exit_code": 0, "wall_time_seconds": 0.01}

    async def run_command(call: NestedToolCall) -> JsonValue:
        return result

    delegate = RecordingDelegate(on_tool=run_command)
    code_mode = await open_code_mode(provider, delegate, [tool("exec_command")])
    with trio.fail_after(10):
        output = await code_mode.exec(
            "call-1", 'text(await tools.exec_command({ cmd: "echo hi" }))'
        )
    assert status_line(output) == "Script completed"
    assert len(output.items) == 2
    [printed] = body(output)
    assert isinstance(printed, str)
    assert json.loads(printed) == result
    assert (output.success, output.status, output.cell_id, output.tool) == (
        True,
        "completed",
        "1",
        "exec",
    )


async def test_code_mode_only_guides_all_tools_search_and_calls_deferred_app_tools(
    provider: Provider,
) -> None:
    # codemode has no separate list of deferred tools: every enabled tool is described, and the
    # flag adds the guidance that finds a tool through ALL_TOOLS, which this cell follows.
    delegate = RecordingDelegate()
    calendar = tool("calendar_create_event", "Create a calendar event.")
    code_mode = await open_code_mode(provider, delegate, [calendar], deferred_tools_available=True)
    assert "Some deferred nested tools may be omitted" in code_mode.exec_description()
    source = """
        const found = ALL_TOOLS.find(({ name, description }) =>
            name.includes("calendar") && description.includes("calendar event"));
        text(JSON.stringify(await tools[found.name]({ title: "standup" })));
    """
    with trio.fail_after(10):
        output = await code_mode.exec("call-1", source)
    assert body(output) == ['{"value":"output"}']
    assert [call.input for call in delegate.invocations] == [{"title": "standup"}]


async def test_app_only_tools_are_not_visible_or_runnable_by_code_mode_model(
    provider: Provider,
) -> None:
    code_mode = await open_code_mode(provider, RecordingDelegate(), [tool("visible_tool")])
    assert "hidden_app_tool" not in code_mode.exec_description()
    with trio.fail_after(10):
        listed = await code_mode.exec("call-1", "text(ALL_TOOLS.map((t) => t.name).join())")
        called = await code_mode.exec("call-2", "await tools.hidden_app_tool({})")
    assert body(listed) == ["visible_tool"]
    assert status_line(called) == "Script failed"
    [error] = body(called)
    assert isinstance(error, str)
    assert error.startswith("Script error:\nTypeError: ")
    assert error.startswith("Script error:\nTypeError: tools.hidden_app_tool is not a function")


async def test_code_mode_update_plan_nested_tool_result_is_empty_object(
    provider: Provider,
) -> None:
    async def update_plan(call: NestedToolCall) -> JsonValue:
        return {}

    delegate = RecordingDelegate(on_tool=update_plan)
    code_mode = await open_code_mode(provider, delegate, [tool("update_plan")])
    source = 'text(JSON.stringify(await tools.update_plan({ plan: [{ step: "a", status: "pending" }] })))'
    with trio.fail_after(10):
        output = await code_mode.exec("call-1", source)
    assert body(output) == ["{}"]
    assert delegate.invocations[0].input == {"plan": [{"step": "a", "status": "pending"}]}


async def test_code_mode_exec_surfaces_handler_errors_as_exceptions(provider: Provider) -> None:
    async def refuse(call: NestedToolCall) -> JsonValue:
        raise ToolError("invalid arguments for lookup")

    code_mode = await open_code_mode(provider, RecordingDelegate(on_tool=refuse), [tool("lookup")])
    source = 'try { await tools.lookup({}); } catch (e) { text("caught: " + e); }'
    with trio.fail_after(10):
        output = await code_mode.exec("call-1", source)
    assert body(output) == ["caught: invalid arguments for lookup"]
    assert output.success


async def test_code_mode_can_output_images_via_global_helper(provider: Provider) -> None:
    url = png_data_url()
    code_mode = await open_code_mode(provider, RecordingDelegate())
    with trio.fail_after(10):
        output = await code_mode.exec("call-1", f'image("{url}"); text("after")')
    assert body(output) == [InputImage(image_url=url, detail=ImageDetail.HIGH), "after"]


async def test_code_mode_replaces_malformed_image(provider: Provider) -> None:
    code_mode = await open_code_mode(provider, RecordingDelegate())
    with trio.fail_after(10):
        output = await code_mode.exec("call-1", 'image("data:image/png;base64,AAA="); text("ok")')
    assert body(output) == [IMAGE_OMITTED, "ok"]
    assert (output.success, output.status) == (True, "completed")


async def test_code_mode_resizes_explicit_original_image(provider: Provider) -> None:
    url = png_data_url(6401, 100)
    code_mode = await open_code_mode(provider, RecordingDelegate())
    with trio.fail_after(20):
        output = await code_mode.exec("call-1", f'image("{url}", "original")')
    [image] = body(output)
    assert isinstance(image, InputImage)
    assert image.detail is ImageDetail.ORIGINAL
    assert decoded_size(image.image_url) == (6000, 94, "PNG")


async def test_code_mode_image_helper_rejects_remote_url(provider: Provider) -> None:
    code_mode = await open_code_mode(provider, RecordingDelegate())
    with trio.fail_after(10):
        output = await code_mode.exec("call-1", 'image("https://example.com/image.png")')
    assert status_line(output) == "Script failed"
    assert body(output) == [
        "Script error:\nTool call failed: remote image URLs are not supported in tool outputs. "
        "Pass a base64 data URI instead"
    ]


async def test_code_mode_can_use_view_image_result_with_image_helper(provider: Provider) -> None:
    url = png_data_url(3, 3)

    async def view_image(call: NestedToolCall) -> JsonValue:
        return {"image_url": url, "detail": "original"}

    code_mode = await open_code_mode(
        provider, RecordingDelegate(on_tool=view_image), [tool("view_image")]
    )
    with trio.fail_after(10):
        output = await code_mode.exec("call-1", 'image(await tools.view_image({ path: "a.png" }))')
    assert body(output) == [InputImage(image_url=url, detail=ImageDetail.ORIGINAL)]


async def test_code_mode_can_use_mcp_image_result_with_image_helper(provider: Provider) -> None:
    data = png_data_url(3, 3).partition(",")[2]

    async def screenshot(call: NestedToolCall) -> JsonValue:
        meta = {"codex/imageDetail": "original"}
        block = {"type": "image", "data": data, "mimeType": "image/png", "_meta": meta}
        return {"content": [{"type": "text", "text": "a screenshot"}, block], "isError": False}

    code_mode = await open_code_mode(
        provider, RecordingDelegate(on_tool=screenshot), [tool("mcp__ui__screenshot")]
    )
    with trio.fail_after(10):
        output = await code_mode.exec(
            "call-1", "image((await tools.mcp__ui__screenshot({})).content[1])"
        )
    assert body(output) == [
        InputImage(image_url=f"data:image/png;base64,{data}", detail=ImageDetail.ORIGINAL)
    ]


async def test_code_mode_can_apply_patch_via_nested_tool(provider: Provider) -> None:
    async def apply_patch(call: NestedToolCall) -> JsonValue:
        assert nested_tool_payload(call) == "*** Begin Patch\n*** End Patch"
        return {}

    apply = ToolDefinition(
        name="apply_patch", tool_name=ToolName.plain("apply_patch"), kind=ToolKind.FREEFORM
    )
    delegate = RecordingDelegate(on_tool=apply_patch)
    code_mode = await open_code_mode(provider, delegate, [apply])
    assert "apply_patch(input: string): Promise<unknown>;" in code_mode.exec_description()
    source = 'text(JSON.stringify(await tools.apply_patch("*** Begin Patch\\n*** End Patch")))'
    with trio.fail_after(10):
        output = await code_mode.exec("call-1", source)
    assert body(output) == ["{}"]
    assert delegate.invocations[0].tool_kind is ToolKind.FREEFORM


async def test_code_mode_exposes_normalized_illegal_mcp_tool_names(provider: Provider) -> None:
    echo = ToolDefinition(
        name="mcp__rmcp__echo-tool", tool_name=ToolName.namespaced("mcp__rmcp__", "echo-tool")
    )
    delegate = RecordingDelegate()
    code_mode = await open_code_mode(provider, delegate, [echo])
    assert "### `mcp__rmcp__echo_tool` (`mcp__rmcp__echo-tool`)" in code_mode.exec_description()
    with trio.fail_after(10):
        output = await code_mode.exec(
            "call-1",
            'text(typeof tools.mcp__rmcp__echo_tool); await tools.mcp__rmcp__echo_tool({ message: "hi" })',
        )
    assert body(output) == ["function"]
    assert delegate.invocations[0].tool_name == ToolName.namespaced("mcp__rmcp__", "echo-tool")


async def test_code_mode_exports_all_tools_metadata_for_builtin_tools(provider: Provider) -> None:
    update_plan = ToolDefinition(
        name="update_plan",
        tool_name=ToolName.plain("update_plan"),
        description="Updates the task plan.",
        input_schema={
            "type": "object",
            "properties": {"explanation": {"type": "string"}},
            "additionalProperties": False,
        },
    )
    code_mode = await open_code_mode(provider, RecordingDelegate(), [update_plan])
    with trio.fail_after(10):
        output = await code_mode.exec("call-1", "text(JSON.stringify(ALL_TOOLS))")
    [listed] = body(output)
    assert isinstance(listed, str)
    assert json.loads(listed) == [
        {
            "name": "update_plan",
            "description": "Updates the task plan.\n\nexec tool declaration:\n```ts\n"
            "declare const tools: { update_plan(args: { explanation?: string; }): "
            "Promise<unknown>; };\n```",
        }
    ]


async def test_code_mode_exports_all_tools_metadata_for_namespaced_mcp_tools(
    provider: Provider,
) -> None:
    echo = ToolDefinition(
        name="mcp__rmcp__echo",
        tool_name=ToolName.namespaced("mcp__rmcp__", "echo"),
        description="Echo back the provided message.",
        input_schema={
            "type": "object",
            "properties": {"message": {"type": "string"}},
            "required": ["message"],
        },
        output_schema={
            "type": "object",
            "properties": {
                "content": {"type": "array", "items": {"type": "object"}},
                "structuredContent": {
                    "type": "object",
                    "properties": {"echo": {"type": "string"}},
                    "required": ["echo"],
                },
                "isError": {"type": "boolean"},
                "_meta": {"type": "object"},
            },
        },
    )
    code_mode = await open_code_mode(provider, RecordingDelegate(), [echo])
    with trio.fail_after(10):
        output = await code_mode.exec("call-1", "text(JSON.stringify(ALL_TOOLS))")
    [listed] = body(output)
    assert isinstance(listed, str)
    assert json.loads(listed) == [
        {"name": "mcp__rmcp__echo", "description": augment_tool_definition(echo).description}
    ]
    assert (
        "declare const tools: { mcp__rmcp__echo(args: { message: string; }): "
        "Promise<CallToolResult<{ echo: string; }>>; };"
    ) in listed
    assert "Shared MCP Types:" in code_mode.exec_description()


async def test_code_mode_can_call_hidden_dynamic_tools(provider: Provider) -> None:
    hidden = ToolDefinition(
        name="codex_app__hidden-dynamic-tool",
        tool_name=ToolName.namespaced("codex_app__", "hidden-dynamic-tool"),
        description="A hidden dynamic tool.",
        input_schema={
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    )
    namespaces = {"codex_app__": NamespaceDescription(name="codex_app", description="App tools.")}
    delegate = RecordingDelegate()
    code_mode = await open_code_mode(
        provider, delegate, [hidden], namespace_descriptions=namespaces
    )
    description = code_mode.exec_description()
    assert "## codex_app\nApp tools." in description
    assert "A hidden dynamic tool." in description
    assert (
        "codex_app__hidden_dynamic_tool(args: { city: string; }): Promise<unknown>;" in description
    )
    with trio.fail_after(10):
        output = await code_mode.exec(
            "call-1",
            'text(JSON.stringify(await tools.codex_app__hidden_dynamic_tool({ city: "Paris" })))',
        )
    assert body(output) == ['{"value":"output"}']
    assert delegate.invocations[0].input == {"city": "Paris"}


async def test_pngs_built_for_these_tests_are_real() -> None:
    # The helpers above build images without Pillow; Pillow must agree they are images.
    assert decoded_size(f"data:image/png;base64,{png_data_url(5, 4).partition(',')[2]}") == (
        5,
        4,
        "PNG",
    )
    assert png_bytes(1, 1).startswith(b"\x89PNG")
