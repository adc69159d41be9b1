"""MCP servers' tools inside cells (`codemode.mcp.open_mcp_toolbox`).

Against a real server no one here wrote (npm `server-everything`, installed by the tests' own
set-up, see tests/mcp_servers.py) and our small SDK server (tests/mcp_test_server.py) for
errors, cancellation, server death and tool-list changes. Cells run in a real host process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio

import codemode
from codemode import (
    Completed,
    InputImage,
    InputText,
    NestedToolCall,
    Session,
    ToolDefinition,
    ToolKind,
    ToolName,
)
from codemode.mcp import McpConnectionError, McpServer, open_mcp_toolbox
from codemode.model import exec_description
from tests.mcp_servers import sdk_server_command
from tests.sessions import execute, run, texts

TIMEOUT = 60


@pytest.fixture
async def session() -> AsyncIterator[Session]:
    async with codemode.open_process_provider() as provider:
        yield await provider.create_session()


def results(response: Completed) -> list[Any]:
    """The JSON values a cell wrote with `text(JSON.stringify(...))`."""
    assert response.error_text is None, response.error_text
    return [json.loads(text) for text in texts(response)]


@pytest.mark.slow
async def test_server_everything_tools_are_typed_calls_in_cells(
    session: Session, everything: list[str]
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_mcp_toolbox({"everything": everything}) as toolbox:
            tools = toolbox.definitions()
            by_name = {tool.name: tool for tool in tools}
            for name in ("echo", "get-sum", "get-structured-content", "get-tiny-image"):
                assert f"mcp__everything__{name}" in by_name
            get_sum = by_name["mcp__everything__get-sum"]
            assert get_sum.tool_name == ToolName.namespaced("mcp__everything", "get-sum")

            description = exec_description(
                tools, namespace_descriptions=toolbox.namespace_descriptions()
            )
            assert description.count("type CallToolResult<TStructured") == 1
            assert description.count("## MCP server `everything`") == 1
            assert "### `mcp__everything__get_sum` (`mcp__everything__get-sum`)" in description
            assert (
                "mcp__everything__get_structured_content(args: {\n"
                "  // Choose city\n"
                '  location: "New York" | "Chicago" | "Los Angeles";\n'
                "}): Promise<CallToolResult<{\n"
            ) in description

            response = await run(
                session,
                toolbox,
                """
                text(JSON.stringify(await tools.mcp__everything__echo({ message: "hi" })));
                text(JSON.stringify(await tools.mcp__everything__get_sum({ a: 2, b: 3 })));
                text(JSON.stringify(await tools.mcp__everything__get_sum({ a: 2, b: "x" })));
                const weather = await tools.mcp__everything__get_structured_content({ location: "Chicago" });
                text(JSON.stringify(weather.structuredContent));
                """,
                tools=tools,
            )
    assert isinstance(response, Completed)
    echo, total, refused, weather = results(response)
    assert echo["content"] == [{"type": "text", "text": "Echo: hi"}]
    assert echo["isError"] is False
    assert total["content"][0]["text"] == "The sum of 2 and 3 is 5."
    # A tool's own failure is a value the cell inspects, not a rejection.
    assert refused["isError"] is True
    assert "expected number" in refused["content"][0]["text"]
    assert set(weather) == {"temperature", "conditions", "humidity"}


@pytest.mark.slow
async def test_image_takes_an_mcp_image_block_of_a_real_result(
    session: Session, everything: list[str]
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_mcp_toolbox({"everything": everything}) as toolbox:
            response = await run(
                session,
                toolbox,
                """
                const result = await tools.mcp__everything__get_tiny_image({});
                const block = result.content.find((item) => item.type === "image");
                image(block);
                text(block.mimeType);
                """,
                tools=toolbox.definitions(),
            )
    assert isinstance(response, Completed)
    assert response.error_text is None
    picture, mime = response.content_items
    assert isinstance(picture, InputImage)
    assert picture.image_url.startswith("data:image/png;base64,iVBORw0KGgo")
    assert picture.detail == "high"
    assert mime == InputText(text="image/png")


@pytest.mark.slow
async def test_a_long_running_operation_runs_and_its_cell_can_be_terminated(
    session: Session, everything: list[str]
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_mcp_toolbox({"everything": everything}) as toolbox:
            tools = toolbox.definitions()
            response = await run(
                session,
                toolbox,
                """
                const done = await tools.mcp__everything__trigger_long_running_operation({ duration: 0.2, steps: 2 });
                text(done.content[0].text);
                """,
                tools=tools,
            )
            assert isinstance(response, Completed)
            assert response.error_text is None
            assert "completed" in texts(response)[0].lower()

            started = await execute(
                session,
                toolbox,
                """
                notify("calling");
                await tools.mcp__everything__trigger_long_running_operation({ duration: 600, steps: 2 });
                """,
                tools=tools,
                yield_time_ms=0,
            )
            async with started:
                pass
            outcome = await session.terminate(started.cell_id)
            assert isinstance(outcome.response, codemode.Terminated)


def call(tool: str, cell_id: str = "1", arguments: Any = None) -> NestedToolCall:
    return NestedToolCall(
        cell_id=cell_id,
        runtime_tool_call_id="tool-1",
        tool_name=ToolName.namespaced("mcp__test", tool),
        tool_kind=ToolKind.FUNCTION,
        input={} if arguments is None else arguments,
    )


@pytest.mark.slow
async def test_errors_reach_the_cell_as_values_or_rejections(session: Session) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_mcp_toolbox({"test": sdk_server_command()}) as toolbox:
            response = await run(
                session,
                toolbox,
                """
                const failed = await tools.mcp__test__fail({});
                text(JSON.stringify([failed.isError, failed.content[0].text]));
                for (const attempt of [() => tools.mcp__test__refuse({}), () => tools.mcp__test__pid("text")]) {
                  try { await attempt(); text(JSON.stringify("resolved")); }
                  catch (error) { text(JSON.stringify(String(error))); }
                }
                """,
                tools=toolbox.definitions(),
            )
    assert isinstance(response, Completed)
    assert results(response) == [
        [True, "it broke"],
        "MCP server test refused refuse: refused on purpose",
        "MCP tool pid takes an object argument, got str",
    ]


@pytest.mark.slow
async def test_cancelling_a_cell_cancels_its_mcp_request(session: Session) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_mcp_toolbox({"test": sdk_server_command()}) as toolbox:
            started = await execute(
                session,
                toolbox,
                "await tools.mcp__test__block({});",
                tools=toolbox.definitions(),
                yield_time_ms=0,
            )
            async with started:
                pass
            # Events on the server's side, no sleeps: `wait_blocked` answers once `block` runs,
            # `wait_cancelled` once the server saw the cancellation.
            blocked = await toolbox.invoke_tool(call("wait_blocked"))
            assert blocked["content"][0]["text"] == "blocked"
            outcome = await session.terminate(started.cell_id)
            assert isinstance(outcome.response, codemode.Terminated)
            cancelled = await toolbox.invoke_tool(call("wait_cancelled"))
            assert cancelled["content"][0]["text"] == "cancelled"


@pytest.mark.slow
async def test_a_server_that_dies_is_reported_and_restarted_on_next_use(
    session: Session,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_mcp_toolbox({"test": sdk_server_command()}) as toolbox:
            response = await run(
                session,
                toolbox,
                """
                const first = (await tools.mcp__test__pid({})).content[0].text;
                try { await tools.mcp__test__exit({}); text("survived"); }
                catch (error) { text(String(error)); }
                const second = (await tools.mcp__test__pid({})).content[0].text;
                text(first !== second ? "restarted" : "same process");
                """,
                tools=toolbox.definitions(),
            )
    assert isinstance(response, Completed)
    assert response.error_text is None
    assert texts(response) == [
        "MCP server test closed the connection before answering exit (did it exit?); "
        "it is started again on the next call",
        "restarted",
    ]


@pytest.mark.slow
async def test_list_changed_updates_the_toolbox_and_a_combination(session: Session) -> None:
    python_tools = codemode.Toolbox()

    @python_tools.tool
    def double(x: int) -> int:
        """Twice x."""
        return 2 * x

    with trio.fail_after(TIMEOUT):
        async with open_mcp_toolbox({"test": sdk_server_command()}) as toolbox:
            combined = codemode.combine(python_tools, toolbox)
            assert "mcp__test__extra" not in names(combined.definitions())
            await toolbox.invoke_tool(call("add_tool"))
            while "mcp__test__extra" not in names(toolbox.definitions()):
                await toolbox.wait_definitions_changed()
            assert names(combined.definitions())[:2] == ["double", "mcp__test__fail"]
            response = await run(
                session,
                combined,
                """
                text((await tools.mcp__test__extra({})).content[0].text);
                text(await tools.double({ x: 21 }));
                """,
                tools=combined.definitions(),
            )
    assert texts(response) == ["extra", "42"]


def names(definitions: list[ToolDefinition]) -> list[str]:
    return [definition.name for definition in definitions]


@pytest.mark.slow
async def test_a_server_that_cannot_start_fails_the_open_with_a_clear_text() -> None:
    with trio.fail_after(TIMEOUT):
        with pytest.raises(McpConnectionError) as missing:
            async with open_mcp_toolbox({"gone": "/nonexistent/mcp-server --flag"}):
                pass  # pragma: no cover
        assert str(missing.value).startswith(
            "cannot connect to MCP server gone (/nonexistent/mcp-server --flag): FileNotFoundError"
        )
        with pytest.raises(McpConnectionError) as refused:
            async with open_mcp_toolbox({"web": "http://127.0.0.1:9/mcp"}):
                pass  # pragma: no cover
        assert str(refused.value).startswith(
            "cannot connect to MCP server web (http://127.0.0.1:9/mcp): "
        )


@pytest.mark.slow
async def test_the_body_exception_leaves_the_toolbox_as_itself() -> None:
    with trio.fail_after(TIMEOUT), pytest.raises(KeyError):
        async with open_mcp_toolbox({"test": sdk_server_command()}):
            raise KeyError("mine")


def test_server_specs_and_config_files(tmp_path: Any) -> None:
    from codemode.mcp import parse_server, read_config
    from codemode.mcp._servers import parse_named

    assert parse_server("npx -y 'a b'") == McpServer(command=["npx", "-y", "a b"])
    assert parse_server(["x", "y z"]) == McpServer(command=["x", "y z"])
    assert parse_server("https://example.com/mcp") == McpServer(url="https://example.com/mcp")
    assert parse_named("fs=npx server --root=/") == (
        "fs",
        McpServer(command=["npx", "server", "--root=/"]),
    )
    for bad in ("nameless", "=x"):
        with pytest.raises(ValueError, match="--server expects NAME=COMMAND_OR_URL"):
            parse_named(bad)
    with pytest.raises(ValueError, match="cannot split the command"):
        parse_server("echo 'open")
    config = tmp_path / "servers.json"
    config.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "fs": {"command": "npx", "args": ["-y", "fs"], "env": {"A": "1"}},
                    "web": {"type": "http", "url": "http://localhost:1/mcp"},
                }
            }
        )
    )
    assert read_config(config) == {
        "fs": McpServer(command=["npx", "-y", "fs"], env={"A": "1"}),
        "web": McpServer(url="http://localhost:1/mcp"),
    }
    config.write_text(json.dumps({"mcpServers": {"odd": {"type": "sse", "url": "http://x"}}}))
    with pytest.raises(ValueError, match="server 'odd' has type 'sse'"):
        read_config(config)
    config.write_text(json.dumps({"mcpServers": {"none": {}}}))
    with pytest.raises(ValueError, match="server 'none': an MCP server needs either"):
        read_config(config)


@pytest.mark.slow
def test_without_the_extra_the_import_error_names_it() -> None:
    code = "import sys; sys.modules['mcp'] = None\nimport codemode.mcp"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "ImportError: codemode.mcp needs the MCP SDK: pip install 'codemode[mcp]'"
    )


@pytest.mark.slow
def test_the_front_door_does_not_import_the_sdk() -> None:
    code = "import sys, codemode; codemode.combine; print('mcp' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"
