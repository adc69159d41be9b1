"""A pydantic-ai toolset giving an `Agent` code mode: `exec` and `wait` over a codemode session,
with the agent's other tools callable from the cells as `tools.<name>`.

```python
async with codemode.aio.open_in_process_provider() as provider:
    session = await provider.create_session()
    agent = Agent(model, toolsets=[CodeModeToolset(session, FunctionToolset([lookup]))])
    result = await agent.run("Which city is warmest?")
```

Rules:
1. `get_tools` lists the wrapped toolset's tools for the step's run context, makes them the
   cells' nested tools (their names, descriptions and parameter schemas) and offers the model
   `exec` (`{"code": ...}`) and `wait` (`cell_id`, `yield_time_ms`, `max_tokens`,
   `terminate`), described as `codemode.CodeMode` describes them.
2. `call_tool` runs the model's call through the session's code mode, with the call's
   `tool_call_id`; the model gets the output's text (the header first, `Script completed`,
   `Script running with cell ID 1`, ...), and with images a list of the text and
   `BinaryContent` images. Failures are outputs, never exceptions (`model-layer.md`).
3. A cell's call of a nested tool validates its arguments with the tool's own validator and
   calls the wrapped toolset with the run context of the step whose `exec` started the cell; a
   `ModelRetry` or any other exception rejects the cell's promise with its message.
4. The session decides the event loop: a `codemode.aio.Session` on asyncio (pydantic-ai 2.68
   starts asyncio tasks itself, so it cannot run under `trio.run`), a `codemode.Session` on
   trio, once a pydantic-ai release runs there.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, Generic

from . import require

require("pydantic_ai", "pydantic-ai", "pydantic-ai-slim>=2.68.0")

from pydantic_ai import ModelRetry, RunContext  # noqa: E402
from pydantic_ai.messages import BinaryContent  # noqa: E402
from pydantic_ai.tools import AgentDepsT, ToolDefinition  # noqa: E402
from pydantic_ai.toolsets import AbstractToolset, FunctionToolset  # noqa: E402
from pydantic_ai.toolsets.abstract import ToolsetTool  # noqa: E402
from pydantic_core import SchemaValidator, core_schema  # noqa: E402

import codemode  # noqa: E402
import codemode.aio  # noqa: E402
from codemode import CellId, InputImage, JsonValue, NestedToolCall, ToolError, ToolOutput  # noqa: E402

from ._shared import AnyCodeMode, as_json, code_mode_of, exec_schema, nested_definition  # noqa: E402

__all__ = ["CodeModeToolset"]

_ANY_ARGUMENTS = SchemaValidator(
    core_schema.dict_schema(core_schema.str_schema(), core_schema.any_schema())
)


@dataclass
class _NestedTools(Generic[AgentDepsT]):
    """The wrapped toolset's tools, served to the cells with one step's run context (rule 3)."""

    toolset: AbstractToolset[AgentDepsT]
    tools: dict[str, ToolsetTool[AgentDepsT]]
    ctx: RunContext[AgentDepsT]

    async def invoke_tool(self, call: NestedToolCall) -> JsonValue:
        name = call.tool_name.name
        tool = self.tools.get(name)
        if tool is None:
            raise ToolError(f"tool {name} is not in this toolset")
        try:
            arguments = tool.args_validator.validate_python(call.input or {})
            ctx = _replace_ctx(self.ctx, tool_name=name, tool_call_id=call.runtime_tool_call_id)
            return as_json(await self.toolset.call_tool(name, arguments, ctx, tool))
        except ModelRetry as retry:
            raise ToolError(retry.message) from retry
        except ToolError:
            raise
        except Exception as error:
            raise ToolError(f"tool {name} failed: {error}") from error

    async def notify(self, call_id: str, cell_id: CellId, text: str) -> None:
        """Notifications have no place in a pydantic-ai run: dropped."""

    def cell_closed(self, cell_id: CellId) -> None:
        """Nothing is kept per cell."""


def _replace_ctx(ctx: RunContext[AgentDepsT], **changes: Any) -> RunContext[AgentDepsT]:
    from dataclasses import replace

    return replace(ctx, **changes)


class CodeModeToolset(AbstractToolset[AgentDepsT]):
    """The `exec` and `wait` tools over a codemode session, for a pydantic-ai agent.

    Args:
        session: a `codemode.aio.Session` (the agent runs on asyncio) or a `codemode.Session`.
        tools: the agent's tools the cells may call as `tools.<name>` (a `FunctionToolset`, or
            any toolset); the model sees them only through `exec`'s description.
        id: the toolset's id among the agent's toolsets.
        max_retries: the retries pydantic-ai allows a malformed `exec` or `wait` call.
        **options: `codemode.CodeMode`'s keyword options (`min_yield_time_ms`, ...).
    """

    def __init__(
        self,
        session: codemode.Session | codemode.aio.Session,
        tools: AbstractToolset[AgentDepsT] | None = None,
        *,
        id: str | None = None,
        max_retries: int = 1,
        **options: Any,
    ) -> None:
        self._session = session
        self._tools: AbstractToolset[AgentDepsT] = tools or FunctionToolset()
        self._id = id
        self._max_retries = max_retries
        self._options = options
        self._code_mode: AnyCodeMode | None = None

    @property
    def id(self) -> str | None:
        return self._id

    async def __aenter__(self) -> CodeModeToolset[AgentDepsT]:
        await self._tools.__aenter__()
        return self

    async def __aexit__(self, *args: Any) -> bool | None:
        return await self._tools.__aexit__(*args)

    async def get_tools(self, ctx: RunContext[AgentDepsT]) -> dict[str, ToolsetTool[AgentDepsT]]:
        nested = await self._tools.get_tools(ctx)
        definitions = [
            nested_definition(name, tool.tool_def.description, tool.tool_def.parameters_json_schema)
            for name, tool in nested.items()
        ]
        delegate = _NestedTools(self._tools, nested, ctx)
        code_mode = code_mode_of(self._session, delegate, definitions, self._options)
        self._code_mode = code_mode
        exec_parameters, wait_parameters = exec_schema(code_mode)
        return {
            name: ToolsetTool(
                toolset=self,
                tool_def=ToolDefinition(
                    name=name, description=description, parameters_json_schema=parameters
                ),
                max_retries=self._max_retries,
                args_validator=_ANY_ARGUMENTS,
            )
            for name, description, parameters in [
                ("exec", code_mode.exec_description(), exec_parameters),
                ("wait", code_mode.wait_description(), wait_parameters),
            ]
        }

    async def call_tool(
        self,
        name: str,
        tool_args: dict[str, Any],
        ctx: RunContext[AgentDepsT],
        tool: ToolsetTool[AgentDepsT],
    ) -> Any:
        if self._code_mode is None:
            await self.get_tools(ctx)
        assert self._code_mode is not None
        output = await self._code_mode.call(name, ctx.tool_call_id or name, tool_args)
        return model_content(output)


def model_content(output: ToolOutput) -> str | list[str | BinaryContent]:
    """What the model gets back (rule 2): the text, with images as `BinaryContent`."""
    images = [item for item in output.items if isinstance(item, InputImage)]
    if not images:
        return output.text
    content: list[str | BinaryContent] = [output.text]
    for image in images:
        header, _, data = image.image_url.partition(",")
        media_type = header.removeprefix("data:").removesuffix(";base64")
        content.append(BinaryContent(data=base64.b64decode(data), media_type=media_type))
    return content
