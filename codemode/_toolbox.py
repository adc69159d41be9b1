"""Typed Python tools: `Toolbox`, a `SessionDelegate` built from annotated functions.

`@toolbox.tool` reads a function's signature (`_schema`) and docstring into a `ToolDefinition`;
the toolbox then serves the cells' calls of those tools.

Rules:
1. A tool's arguments are validated before the function runs (`msgspec.convert`, strict): a
   rejection names the field (`... - at `$.city``) and reaches the cell's `catch` as a plain
   string, like every `ToolError` text.
2. A `ToolError` raised by a tool passes through unchanged; anything else it raises (also
   `SystemExit`, `KeyboardInterrupt` or asyncio's `CancelledError`: `_trio.contained`) becomes
   `tool <name> failed: <message>` for the cell and is logged with its traceback (logger
   `codemode.toolbox`). Only the call's own cancellation passes through.
3. A plain function runs in a thread of the provider's own (`_tool_threads`: not trio's default
   limiter, which the application shares), abandoned on cancel: a cell that ends while it
   blocks does not wait for it, and its late result is discarded. A plain `on_notify` runs in
   such a thread too, so a blocking handler never stalls the trio loop.
4. Mistakes in a tool's definition (no annotations, `*args`, a name taken twice) raise when it
   is defined, never when a cell calls it.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar, overload

import msgspec

from ._api import CellId, JsonValue, NestedToolCall, ToolDefinition, ToolName
from ._identifiers import normalize_identifier
from ._schema import tool_signature
from .errors import ToolError, tool_failure_message

logger = logging.getLogger("codemode.toolbox")

ToolFunction = TypeVar("ToolFunction", bound=Callable[..., Any])

NotifyHandler = Callable[[CellId, str], Awaitable[None] | None]


async def deliver_notification(
    on_notify: NotifyHandler | None, cell_id: CellId, text: str, log: logging.Logger
) -> None:
    """Hand a cell's `notify(text)` to `on_notify`, awaited if it returns an awaitable (without
    a handler: logged at INFO on `log`)."""
    if on_notify is None:
        log.info("notification from cell %s: %s", cell_id, text)
        return
    if inspect.iscoroutinefunction(on_notify):
        await on_notify(cell_id, text)
        return
    from ._tool_threads import run_in_tool_thread  # not at import: it loads trio (rule 3)

    result = await run_in_tool_thread("on_notify", functools.partial(on_notify, cell_id, text))
    if result is not None:
        await result


"""Receives a cell's `notify(text)`: `handler(cell_id, text)`, plain or `async`."""

RESERVED_NAMES = frozenset({"exec", "wait"})
"""The model's own tools; a nested tool cannot take their names (design.md, runtime 8.3)."""


class _Tool:
    """One registered tool: its definition and how to call its function."""

    __slots__ = ("arguments", "definition", "function", "is_async", "needs_approval")

    def __init__(
        self,
        definition: ToolDefinition,
        function: Callable[..., Any],
        arguments: type[msgspec.Struct],
        needs_approval: bool = False,
    ) -> None:
        self.needs_approval = needs_approval
        self.definition = definition
        self.function = function
        self.arguments = arguments
        self.is_async = inspect.iscoroutinefunction(function)

    def read_arguments(self, value: JsonValue) -> dict[str, Any]:
        """The keyword arguments `value` (from JavaScript) stands for.

        Raises:
            ToolError: `value` does not match the signature.
        """
        try:
            arguments = msgspec.convert({} if value is None else value, self.arguments, strict=True)
        except msgspec.ValidationError as error:
            raise ToolError(f"invalid arguments for tool {self.definition.name}: {error}") from None
        return msgspec.structs.asdict(arguments)

    async def run(self, arguments: dict[str, Any]) -> Any:
        if self.is_async:
            return await self.function(**arguments)
        # Imported here: `import codemode` must not load trio (the host imports
        # `codemode.protocol`, which stays sans-IO; tests/test_protocol.py checks it).
        from ._tool_threads import run_in_tool_thread

        call = functools.partial(self.function, **arguments)
        return await run_in_tool_thread(self.definition.name, call)


class Toolbox:
    """Typed Python tools for cells, and the `SessionDelegate` that serves them.

    Args:
        on_notify: receives each `notify(text)` of a cell as `on_notify(cell_id, text)`, a plain
            or an `async` function; by default the text is logged at INFO (logger
            `codemode.toolbox`).

    Pass `toolbox.definitions()` as the enabled tools and the toolbox as the delegate (to
    `Session.execute` or `CodeMode`); `combine` joins several toolboxes into one delegate.
    """

    def __init__(self, on_notify: NotifyHandler | None = None) -> None:
        self._on_notify = on_notify
        self._tools: dict[ToolName, _Tool] = {}

    @overload
    def tool(self, function: ToolFunction, /) -> ToolFunction: ...

    @overload
    def tool(
        self,
        *,
        name: str | None = None,
        namespace: str | None = None,
        needs_approval: bool = False,
    ) -> Callable[[ToolFunction], ToolFunction]: ...

    def tool(
        self,
        function: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        namespace: str | None = None,
        needs_approval: bool = False,
    ) -> Callable[..., Any]:
        """Register a function as a tool: `@toolbox.tool` or `@toolbox.tool(name=...)`.

        The function's docstring is the tool's description; its annotated parameters are the
        properties of the tool's input object (defaults make them optional); its return
        annotation gives the output schema. The return value is converted to JSON with
        `msgspec.to_builtins` (Structs, dataclasses, enums, dates and the like are fine).

        Args:
            function: an `async def` function, or a plain one (run in a worker thread); a
                bound method is fine too.
            name: the tool's name (default: the function's name).
            namespace: groups the tool under a namespace (its `ToolName.namespace`); the
                model-visible name becomes `<namespace>__<name>`.
            needs_approval: a call of it runs only once approved (`docs/governance.md`): the
                default policy asks the approver, and denies when there is none.

        Returns:
            The function itself, unchanged (or a decorator doing this, with keywords only).

        Raises:
            TypeError: the function is not a plain or `async` function, lacks a docstring or an
                annotation, or takes `*args`, `**kwargs` or positional-only parameters.
            ValueError: the name is empty, reserved (`exec`, `wait`), or already taken in this
                toolbox (also when two names give the same JavaScript identifier).
        """

        def register(function: Callable[..., Any]) -> Callable[..., Any]:
            self._add(function, name, namespace, needs_approval)
            return function

        return register if function is None else register(function)

    def _add(
        self,
        function: Callable[..., Any],
        name: str | None,
        namespace: str | None,
        needs_approval: bool = False,
    ) -> None:
        is_function = inspect.isfunction(function) or inspect.ismethod(function)
        if not is_function or inspect.isgeneratorfunction(function):
            raise TypeError(f"a tool must be a plain or async function, got {function!r}")
        if inspect.isasyncgenfunction(function):
            raise TypeError(f"a tool must be a plain or async function, got {function!r}")
        own_name = function.__name__ if name is None else name
        flat_name = own_name if namespace is None else f"{namespace}__{own_name}"
        if not own_name or namespace == "":
            raise ValueError(f"tool names must not be empty, got {flat_name!r}")
        description = inspect.getdoc(function)
        if not description:
            raise TypeError(
                f"tool {flat_name} has no docstring: it is the description the model reads"
            )
        signature = tool_signature(function, flat_name)
        definition = ToolDefinition(
            name=flat_name,
            tool_name=ToolName(name=own_name, namespace=namespace),
            description=description,
            input_schema=signature.input_schema,
            output_schema=signature.output_schema,
        )
        check_unique([*self.definitions(), definition])
        self._tools[definition.tool_name] = _Tool(
            definition, function, signature.arguments, needs_approval
        )

    def needs_approval(self, tool: ToolName) -> bool:
        """Whether `tool` was registered with `needs_approval=True`."""
        found = self._tools.get(tool)
        return found is not None and found.needs_approval

    def definitions(self) -> list[ToolDefinition]:
        """The tools' definitions, in the order they were registered.

        Pass them as `ExecuteRequest.enabled_tools` (or to `CodeMode`).
        """
        return [tool.definition for tool in self._tools.values()]

    async def invoke_tool(self, call: NestedToolCall) -> JsonValue:
        """Validate the call's arguments, run the tool and return its result as JSON.

        Raises:
            ToolError: the arguments do not match the signature, the tool raised `ToolError`
                or failed (`tool <name> failed: <message>`), or it is not in this toolbox.
        """
        tool = self._tools.get(call.tool_name)
        if tool is None:
            raise ToolError(f"tool {call.tool_name.name} is not in this toolbox")
        if tool.needs_approval:
            from ._governance import NO_APPROVER, approved, denial

            if approved.get() is not call:  # rule 2 of `_governance`: nobody approved it
                raise denial(normalize_identifier(tool.definition.name), NO_APPROVER)
        arguments = tool.read_arguments(call.input)
        try:
            return msgspec.to_builtins(await tool.run(arguments))
        except ToolError:
            raise
        except BaseException as error:
            from ._trio import contained  # not at import: it loads trio (rule 3)

            if not contained(error):
                raise  # the call's own cancellation
            logger.error(
                "tool %s failed (cell %s)", tool.definition.name, call.cell_id, exc_info=error
            )
            raise ToolError(tool_failure_message(tool.definition.name, error)) from error

    async def notify(self, call_id: str, cell_id: CellId, text: str) -> None:
        """Hand a cell's `notify(text)` to `on_notify` (or log it at INFO)."""
        await deliver_notification(self._on_notify, cell_id, text, logger)

    def cell_closed(self, cell_id: CellId) -> None:
        """Nothing to release: a toolbox keeps no state per cell."""

    def __repr__(self) -> str:
        return f"<Toolbox with {len(self._tools)} tools: {', '.join(self._names())}>"

    def _names(self) -> Iterable[str]:
        return (tool.definition.name for tool in self._tools.values())


def check_unique(definitions: Iterable[ToolDefinition]) -> None:
    """Check that no two tools share a name, a routing name or a JavaScript identifier.

    Raises:
        ValueError: naming the tool and what it clashes with.
    """
    by_identifier: dict[str, ToolDefinition] = {}
    by_route: dict[ToolName, ToolDefinition] = {}
    for definition in definitions:
        if definition.name in RESERVED_NAMES:
            raise ValueError(f"tool name {definition.name} is reserved for the model's own tool")
        identifier = normalize_identifier(definition.name)
        same_identifier = by_identifier.get(identifier)
        if same_identifier is not None:
            if same_identifier.name == definition.name:
                raise ValueError(f"tool name {definition.name} is defined twice")
            raise ValueError(
                f"tool names {same_identifier.name} and {definition.name} clash: "
                f"both are tools.{identifier} in JavaScript"
            )
        same_route = by_route.get(definition.tool_name)
        if same_route is not None:
            raise ValueError(
                f"tools {same_route.name} and {definition.name} share the routing name "
                f"{definition.tool_name!r}"
            )
        by_identifier[identifier] = definition
        by_route[definition.tool_name] = definition
