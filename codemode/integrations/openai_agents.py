"""The OpenAI Agents SDK in code mode: `exec` and `wait` as an agent's function tools over a
codemode session, with the agent's other function tools callable from the cells.

```python
async with codemode.aio.open_in_process_provider() as provider:
    session = await provider.create_session()
    agent = Agent(name="weather", tools=code_mode_tools(session, [lookup]))
    result = await Runner.run(agent, "Which city is warmest?")
```

Rules:
1. `code_mode_tools(session, tools)` returns two `FunctionTool`s: `exec` (`{"code": ...}`) and
   `wait` (`cell_id`, `yield_time_ms`, `max_tokens`, `terminate`), described as
   `codemode.CodeMode` describes them, with `tools` (function tools) as the cells' nested
   tools. Hand the agent these two instead of `tools`.
2. A call runs through the session's code mode with the call's `tool_call_id`; the model gets
   the output's text (the header first), and with images a list of `ToolOutputText` and
   `ToolOutputImage`. Failures are outputs, never exceptions (`model-layer.md`).
3. A cell's call of a nested tool goes to that tool's `on_invoke_tool` with a `ToolContext` of
   its own (the run context of the `exec` or `wait` call that was running, the nested call's
   name, id and JSON arguments); its value is converted to JSON. What the tool raises rejects
   the cell's promise; a tool made by `@function_tool` turns its own failures into a text
   result first (its `failure_error_function`), which the cell gets as the value.
4. The Agents SDK runs on asyncio: the session is a `codemode.aio.Session` (a trio
   `codemode.Session` is taken too, for a loop that runs the SDK under trio).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from . import require

require("agents", "openai-agents", "openai-agents>=0.24.0")

from agents import FunctionTool, RunContextWrapper, Tool, ToolOutputImage, ToolOutputText  # noqa: E402
from agents.tool_context import ToolContext  # noqa: E402

import codemode  # noqa: E402
import codemode.aio  # noqa: E402
from codemode import CellId, InputImage, JsonValue, NestedToolCall, ToolError, ToolOutput  # noqa: E402

from ._shared import as_json, code_mode_of, exec_schema, nested_definition  # noqa: E402

__all__ = ["code_mode_tools"]


class _NestedTools:
    """The agent's function tools, served to the cells (rule 3)."""

    def __init__(self, tools: Sequence[FunctionTool]) -> None:
        self._tools = {tool.name: tool for tool in tools}
        self.context: RunContextWrapper[Any] | None = None
        """The run context of the latest `exec` or `wait` call."""

    async def invoke_tool(self, call: NestedToolCall) -> JsonValue:
        name = call.tool_name.name
        tool = self._tools.get(name)
        if tool is None:
            raise ToolError(f"tool {name} is not in these tools")
        arguments = json.dumps({} if call.input is None else call.input)
        context = ToolContext(
            context=None if self.context is None else self.context.context,
            tool_name=name,
            tool_call_id=call.runtime_tool_call_id,
            tool_arguments=arguments,
        )
        try:
            return as_json(await tool.on_invoke_tool(context, arguments))
        except ToolError:
            raise
        except Exception as error:
            raise ToolError(f"tool {name} failed: {error}") from error

    async def notify(self, call_id: str, cell_id: CellId, text: str) -> None:
        """Notifications have no place in an agent run: dropped."""

    def cell_closed(self, cell_id: CellId) -> None:
        """Nothing is kept per cell."""


def code_mode_tools(
    session: codemode.Session | codemode.aio.Session,
    tools: Sequence[FunctionTool] = (),
    **options: Any,
) -> list[Tool]:
    """`exec` and `wait` as function tools over `session`, with `tools` callable from the cells
    (rule 1).

    Args:
        session: a `codemode.aio.Session` (the Agents SDK runs on asyncio), or a trio one.
        tools: the agent's function tools the cells may call as `tools.<name>`.
        **options: `codemode.CodeMode`'s keyword options (`min_yield_time_ms`, ...).
    """
    nested = _NestedTools(tools)
    definitions = [
        nested_definition(tool.name, tool.description, tool.params_json_schema) for tool in tools
    ]
    code_mode = code_mode_of(session, nested, definitions, options)
    exec_parameters, wait_parameters = exec_schema(code_mode)

    def invoker(name: str) -> Any:
        async def on_invoke_tool(context: ToolContext[Any], arguments: str) -> Any:
            nested.context = context
            output = await code_mode.call(name, context.tool_call_id, json.loads(arguments))
            return model_content(output)

        return on_invoke_tool

    return [
        FunctionTool(
            name=name,
            description=description,
            params_json_schema=parameters,
            on_invoke_tool=invoker(name),
            strict_json_schema=False,
        )
        for name, description, parameters in [
            ("exec", code_mode.exec_description(), exec_parameters),
            ("wait", code_mode.wait_description(), wait_parameters),
        ]
    ]


def model_content(output: ToolOutput) -> str | list[ToolOutputText | ToolOutputImage]:
    """What the model gets back (rule 2): the text, with images as `ToolOutputImage`s."""
    images = [item for item in output.items if isinstance(item, InputImage)]
    if not images:
        return output.text
    content: list[ToolOutputText | ToolOutputImage] = [ToolOutputText(text=output.text)]
    content += [ToolOutputImage(image_url=image.image_url) for image in images]
    return content
