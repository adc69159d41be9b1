"""Code mode as an MCP server (`codemode mcp serve`), driven by the `mcp` SDK's own client.

Over stdio (the real command, a real host process, an upstream MCP server and a Python
toolbox) and over streamable HTTP (bearer token, wrong token, Origin check, a session per
client); the service's shutdown terminating cells is checked in memory.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
import trio
from mcp import Client, StdioServerParameters
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

import codemode
from codemode import CellId, Toolbox
from codemode.mcp._serve import open_code_mode_service
from tests.mcp_servers import sdk_server_command
from tests.sessions import run, texts
from tests.test_model_images import png_data_url
from tests.typecheck import ROOT

TIMEOUT = 60

# The SDK's HTTP client in the handshake era leaves the async generators of its standing GET
# stream (httpx2's SSE iterators) to the garbage collector when it closes, which trio reports as
# a ResourceWarning: the client's leak, not the server's.
SDK_HTTP_CLIENT_LEAK = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
CODEMODE = str(Path(sys.executable).with_name("codemode"))


def stdio(*arguments: str) -> StdioServerParameters:
    return StdioServerParameters(command=CODEMODE, args=["mcp", "serve", *arguments], cwd=ROOT)


def text_of(result: types.CallToolResult) -> str:
    return "".join(block.text for block in result.content if isinstance(block, types.TextContent))


def cell_id_of(result: types.CallToolResult) -> str:
    match = re.search(r"Script running with cell ID (\S+)", text_of(result))
    assert match is not None, text_of(result)
    return match.group(1)


@pytest.mark.slow
async def test_stdio_exec_and_wait_with_python_and_upstream_mcp_tools() -> None:
    server = stdio(
        "--tools",
        "examples.weather_tools:toolbox",
        "--server",
        "test=" + " ".join(sdk_server_command()),
    )
    messages: list[types.LoggingMessageNotificationParams] = []
    reports: list[tuple[float, str | None]] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        messages.append(params)

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        reports.append((progress, message))

    with trio.fail_after(TIMEOUT):
        async with Client(server, logging_callback=on_log, log_level="info") as client:
            listed = (await client.list_tools()).tools
            assert [tool.name for tool in listed] == ["exec", "wait"]
            exec_tool, wait_tool = listed
            assert exec_tool.input_schema["required"] == ["code"]
            assert set(wait_tool.input_schema["properties"]) == {
                "cell_id",
                "yield_time_ms",
                "max_tokens",
                "terminate",
            }
            description = exec_tool.description or ""
            assert "### `forecast`" in description
            assert "## MCP server `test`" in description
            assert (
                "mcp__test__fail(args: { [key: string]: unknown; }): Promise<CallToolResult>;"
                in description
            )

            result = await client.call_tool(
                "exec",
                {
                    "code": 'notify("looking"); '
                    'const day = (await tools.forecast({ city: "Oslo", days: 1 }))[0]; '
                    "const failed = await tools.mcp__test__fail({}); "
                    "text(`${typeof day.high} ${failed.isError}`);"
                },
                progress_callback=on_progress,
            )
            assert result.is_error is False
            assert text_of(result).startswith("Script completed\nWall time ")
            assert text_of(result).endswith("Output:\nnumber true")
            assert [(m.level, m.logger, m.data) for m in messages] == [
                ("info", "codemode.cell.1", "looking")
            ]
            assert reports == [(1.0, "looking")]

            running = await client.call_tool(
                "exec",
                {
                    "code": '// @exec: {"yield_time_ms": 0}\n'
                    "await new Promise((resolve) => setTimeout(resolve, 50));\n"
                    f'image("{png_data_url()}"); text("done");'
                },
            )
            assert running.is_error is False
            cell_id = cell_id_of(running)
            finished = await client.call_tool("wait", {"cell_id": cell_id})
            assert isinstance(finished.content[1], types.ImageContent)
            assert finished.content[1].mime_type == "image/png"
            assert text_of(finished).endswith("done")

            failed = await client.call_tool("exec", {"code": "throw new Error('nope')"})
            assert failed.is_error is True
            assert "Script failed" in text_of(failed)
            assert "Error: nope" in text_of(failed)
            unknown = await client.call_tool("wait", {"cell_id": "99"})
            assert unknown.is_error is True
            assert "exec cell 99 not found" in text_of(unknown)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_upstream_tool_changes_reach_the_client(mode: str) -> None:
    server = stdio("--server", "test=" + " ".join(sdk_server_command()))
    changed = trio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    async def listen(client: Client, *, task_status: trio.TaskStatus[None]) -> None:
        async with client.listen(tools_list_changed=True) as subscription:
            task_status.started()  # acknowledged by the server: no change can slip past
            async for _ in subscription:
                changed.set()

    with trio.fail_after(TIMEOUT):
        async with (
            Client(server, mode=mode, message_handler=on_message) as client,
            trio.open_nursery() as nursery,
        ):
            # A 2026-07-28 client (what "auto" gets from an SDK server) listens for changes;
            # a handshake-era one is sent `notifications/tools/list_changed`.
            if mode == "auto":
                await nursery.start(listen, client)
            before = (await client.list_tools(cache_mode="refresh")).tools[0].description or ""
            assert "mcp__test__extra" not in before
            await client.call_tool("exec", {"code": "await tools.mcp__test__add_tool({})"})
            await changed.wait()
            after = (await client.list_tools(cache_mode="refresh")).tools[0].description or ""
            assert "### `mcp__test__extra`" in after
            nursery.cancel_scope.cancel()


@pytest.mark.slow
async def test_shutting_the_service_down_terminates_its_cells() -> None:
    closed: list[CellId] = []
    started = trio.Event()

    class Recording(Toolbox):
        def cell_closed(self, cell_id: CellId) -> None:
            closed.append(cell_id)

    tools = Recording()

    @tools.tool
    async def hang() -> None:
        """Blocks until cancelled."""
        started.set()
        await trio.sleep_forever()

    with trio.fail_after(TIMEOUT):
        async with codemode.open_process_provider() as provider:
            async with open_code_mode_service(provider, tools) as service:
                server = service.server()
                async with Client(server, mode="legacy") as client:
                    answer = await client.call_tool(
                        "exec", {"code": '// @exec: {"yield_time_ms": 0}\nawait tools.hang();'}
                    )
                    assert "Script running with cell ID 1" in text_of(answer)
                    await started.wait()
                    assert closed == []
            assert closed == ["1"]


def free_port_url(line: bytes) -> str:
    match = re.search(rb"serving MCP on (\S+)", line)
    assert match is not None, line
    return match.group(1).decode()


@asynccontextmanager
async def http_server(*arguments: str) -> AsyncIterator[str]:
    """`codemode mcp serve --http 127.0.0.1:0 ...` running; yields its URL."""
    command = [CODEMODE, "mcp", "serve", "--http", "127.0.0.1:0", *arguments]
    async with trio.open_nursery() as nursery:
        process = await trio.lowlevel.open_process(command, stderr=subprocess.PIPE, cwd=ROOT)
        assert process.stderr is not None
        seen = b""
        while b"\n" not in seen:
            chunk = await process.stderr.receive_some()
            assert chunk, seen
            seen += chunk
        try:
            yield free_port_url(seen)
        finally:
            process.terminate()
            with trio.move_on_after(TIMEOUT):
                await process.wait()
            nursery.cancel_scope.cancel()


def with_token(token: str | None) -> httpx2.AsyncClient:
    headers = None if token is None else {"Authorization": f"Bearer {token}"}
    return create_mcp_http_client(headers=headers)


@pytest.mark.slow
async def test_http_needs_the_token_and_checks_the_origin(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    from mcp.client.streamable_http import streamable_http_client

    with trio.fail_after(TIMEOUT):
        async with http_server("--token-file", str(token_file)) as url:
            async with (
                with_token("s3cret-token") as http,
                Client(streamable_http_client(url, http_client=http)) as client,
            ):
                result = await client.call_tool("exec", {"code": "text(6 * 7)"})
                assert text_of(result).endswith("Output:\n42")
            for token in (None, "wrong"):
                async with with_token(token) as http:
                    # The SDK's client reports a refused handshake as an MCP error (inside
                    # anyio's task groups); the raw request below shows the status itself.
                    with pytest.raises((MCPError, ExceptionGroup)):
                        async with Client(streamable_http_client(url, http_client=http)):
                            pass  # pragma: no cover
                    answer = await http.post(url, json={})
                    assert answer.status_code == 401
            async with with_token("s3cret-token") as http:
                evil = await http.post(
                    url,
                    json={},
                    headers={
                        "Origin": "http://evil.example",
                        "Accept": "application/json, text/event-stream",
                    },
                )
                assert evil.status_code == 403


@pytest.mark.slow
@SDK_HTTP_CLIENT_LEAK
async def test_http_gives_each_client_its_own_session() -> None:
    with trio.fail_after(TIMEOUT):
        async with (
            http_server() as url,
            Client(url, mode="legacy") as first,
            Client(url, mode="legacy") as second,
        ):
            await first.call_tool("exec", {"code": 'store("who", "first")'})
            seen = await second.call_tool("exec", {"code": 'text(String(load("who")))'})
            assert text_of(seen).endswith("Output:\nundefined")
            mine = await first.call_tool("exec", {"code": 'text(load("who"))'})
            assert text_of(mine).endswith("Output:\nfirst")


@pytest.mark.slow
async def test_a_toolbox_reaches_an_http_server_by_url_with_headers(tmp_path: Path) -> None:
    from codemode.mcp import McpServer, open_mcp_toolbox

    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token")
    with trio.fail_after(TIMEOUT):
        async with http_server("--token-file", str(token_file)) as url:
            upstream = McpServer(url=url, headers={"Authorization": "Bearer s3cret-token"})
            async with (
                open_mcp_toolbox({"inner": upstream}) as toolbox,
                codemode.open_process_provider() as provider,
            ):
                assert [d.name for d in toolbox.definitions()] == [
                    "mcp__inner__exec",
                    "mcp__inner__wait",
                ]
                session = await provider.create_session()
                response = await run(
                    session,
                    toolbox,
                    'const inner = await tools.mcp__inner__exec({ code: "text(6 * 7)" });\n'
                    "text(inner.content.map((block) => block.text).join(''));",
                    tools=toolbox.definitions(),
                )
    assert isinstance(response, codemode.Completed)
    assert response.error_text is None
    assert texts(response)[0].endswith("Output:\n42")


@SDK_HTTP_CLIENT_LEAK
async def test_an_http_client_that_leaves_ends_its_session() -> None:
    from codemode.mcp._http import serve_http

    closed = trio.Event()
    started = trio.Event()

    class Recording(Toolbox):
        def cell_closed(self, cell_id: CellId) -> None:
            closed.set()

    tools = Recording()

    @tools.tool
    async def hang() -> None:
        """Blocks until cancelled."""
        started.set()
        await trio.sleep_forever()

    with trio.fail_after(TIMEOUT):
        async with (
            codemode.open_in_process_provider() as provider,
            open_code_mode_service(provider, tools) as service,
            trio.open_nursery() as nursery,
        ):
            url = await nursery.start(serve_http, service, "127.0.0.1", 0)
            # A handshake-era client has an `mcp-session-id`; closing, it DELETEs the session.
            async with Client(url, mode="legacy") as client:
                code = '// @exec: {"yield_time_ms": 0}\nawait tools.hang();'
                running = await client.call_tool("exec", {"code": code})
                assert "Script running with cell ID" in text_of(running)
                await started.wait()
                assert not closed.is_set()
            await closed.wait()
            nursery.cancel_scope.cancel()


def test_serve_option_mistakes_are_usage_errors(tmp_path: Path) -> None:
    from codemode._cli_inputs import UsageError
    from codemode.mcp._cli import ServeOptions, http_address, read_token, upstream_servers

    for options, message in [
        (ServeOptions(servers=["nameless"]), "--server expects NAME=COMMAND_OR_URL"),
        (ServeOptions(servers=["a=x", "a=y"]), "MCP server a is given twice"),
        (ServeOptions(config=str(tmp_path / "missing.json")), "cannot read"),
    ]:
        with pytest.raises(UsageError, match=re.escape(message)):
            upstream_servers(options)
    assert http_address("[::1]:0") == ("::1", 0)
    with pytest.raises(UsageError, match="--http expects HOST:PORT"):
        http_address("8765")
    (tmp_path / "token").write_text("two words")
    with pytest.raises(UsageError, match="must hold one token"):
        read_token(str(tmp_path / "token"))


@pytest.mark.slow
async def test_serve_refuses_an_open_address_and_reports_a_missing_server() -> None:
    cases = [
        (["--http", "0.0.0.0:8765"], "refusing to serve on 0.0.0.0 without --token-file"),
        (["--server", "gone=/nonexistent/server"], "cannot connect to MCP server gone"),
    ]
    results: dict[int, subprocess.CompletedProcess[bytes]] = {}

    async def serve(index: int, arguments: list[str]) -> None:
        command = [CODEMODE, "mcp", "serve", *arguments]
        results[index] = await trio.run_process(command, capture_stderr=True, check=False, cwd=ROOT)

    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:  # each start imports the SDK: in parallel
            for index, (arguments, _) in enumerate(cases):
                nursery.start_soon(serve, index, arguments)
    for index, (arguments, message) in enumerate(cases):
        result = results[index]
        stderr = result.stderr.decode()
        # Usage errors exit with 2 before anything starts; an unreachable server with 1.
        assert result.returncode == (1 if "gone" in message else 2), (arguments, stderr)
        assert stderr.startswith("codemode: "), stderr
        assert message in stderr
        assert len(stderr.strip().splitlines()) == 1, stderr


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


@pytest.mark.slow
async def test_the_copy_paste_examples_of_docs_mcp_run(everything: list[str]) -> None:
    toolbox_example, client_example = python_blocks(ROOT / "docs" / "mcp.md")
    npx = '"npx -y @modelcontextprotocol/server-everything@2026.8.31"'
    assert npx in toolbox_example
    # The same server, from the tests' own npm cache instead of npx's.
    toolbox_example = toolbox_example.replace(npx, repr(everything))
    client_example = client_example.replace('".venv/bin/codemode"', repr(CODEMODE))
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            outputs: dict[str, str] = {}

            async def run_example(name: str, code: str) -> None:
                result = await trio.run_process(
                    [sys.executable, "-c", code], capture_stdout=True, cwd=ROOT
                )
                outputs[name] = result.stdout.decode()

            nursery.start_soon(run_example, "toolbox", toolbox_example)
            nursery.start_soon(run_example, "client", client_example)
    assert outputs["toolbox"].startswith("Script completed\nWall time ")
    assert "The sum of 2 and 3 is 5." in outputs["toolbox"]
    assert outputs["client"].startswith("False Script completed\nWall time ")
    assert '"sky":' in outputs["client"]


# ---- stdio: requests the SDK cannot parse, tools that exit ---------------------------------------


async def read_line(stream: trio.abc.ReceiveStream, buffer: bytearray) -> dict[str, Any]:
    while b"\n" not in buffer:
        chunk = await stream.receive_some()
        assert chunk, bytes(buffer)
        buffer += chunk
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    message: dict[str, Any] = json.loads(line)
    return message


@pytest.mark.slow
@pytest.mark.slow
async def test_stdio_answers_a_request_holding_a_lone_surrogate() -> None:
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"},
        },
    }
    # Valid JSON that the SDK's parser refuses: "\ud83d" is half of a character.
    lone = r'{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "exec", "arguments": {"code": "text(\"half: \ud83d\")"}}}'
    listing = (
        r'{"jsonrpc": "2.0", "id": "l", "method": "tools/list", "params": {"cursor": "\udc00"}}'
    )
    after = {
        "jsonrpc": "2.0",
        "id": 3,
        "method": "tools/call",
        "params": {"name": "exec", "arguments": {"code": "text('still here')"}},
    }
    with trio.fail_after(TIMEOUT):
        process = await trio.lowlevel.open_process(
            [CODEMODE, "mcp", "serve"],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert process.stdin is not None
        assert process.stdout is not None
        buffer = bytearray()
        await process.stdin.send_all(json.dumps(initialize).encode() + b"\n")
        assert (await read_line(process.stdout, buffer))["id"] == 1
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        await process.stdin.send_all(json.dumps(initialized).encode() + b"\n")
        await process.stdin.send_all(lone.encode() + b"\n")
        answer = await read_line(process.stdout, buffer)
        await process.stdin.send_all(listing.encode() + b"\n")
        refused = await read_line(process.stdout, buffer)
        await process.stdin.send_all(json.dumps(after).encode() + b"\n")
        next_answer = await read_line(process.stdout, buffer)
        await process.stdin.aclose()
        status = await process.wait()
    assert answer["id"] == 2
    assert answer["result"]["isError"] is True
    [block] = answer["result"]["content"]
    assert block["text"].startswith("the request holds a lone surrogate escape")
    assert refused["id"] == "l"
    assert refused["error"]["code"] == types.INVALID_REQUEST
    assert next_answer["id"] == 3
    assert next_answer["result"]["isError"] is False
    assert [block["text"] for block in next_answer["result"]["content"]][1:] == ["still here"]
    assert status == 0


EXITING_TOOLS = """
import codemode

toolbox = codemode.Toolbox()

@toolbox.tool
def exits() -> str:
    \"\"\"Calls sys.exit, as argparse does on bad input.\"\"\"
    raise SystemExit(2)
"""


@pytest.mark.slow
@pytest.mark.slow
async def test_stdio_a_tool_raising_system_exit_fails_only_its_call(tmp_path: Path) -> None:
    # needs the tool-containment fix (a tool's SystemExit rejects its call's promise)
    (tmp_path / "exiting_tools.py").write_text(EXITING_TOOLS)
    server = StdioServerParameters(
        command=CODEMODE,
        args=["mcp", "serve", "--tools", "exiting_tools:toolbox"],
        cwd=tmp_path,
    )
    with trio.fail_after(20):
        async with Client(server) as client:
            code = 'try { await tools.exits(); } catch (e) { text("caught " + e); }'
            result = await client.call_tool("exec", {"code": code})
            assert not result.is_error, text_of(result)
            assert "caught " in text_of(result)
            result = await client.call_tool("exec", {"code": "text('next')"})
            assert text_of(result).endswith("next")
