"""`combine`: several tool sources served to a session as one delegate.

A *tool source* is anything with `definitions()` and the `SessionDelegate` methods: a
`Toolbox`, an MCP toolbox, another combination.

Rules:
1. The definitions are checked when the sources are combined: a name (or JavaScript
   identifier, or routing name) taken twice is an error then, not at the first call.
2. `definitions()` and the routing read the sources again at each use, so a source whose tools
   change (an MCP server's `tools/list_changed`) is seen as it is now; a tool that clashes with
   an earlier source's is then left out. `invoke_tool` goes to the first source that defines
   `call.tool_name`.
3. `notify` and `cell_closed` go to every source: a cell is not bound to one of them.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ._api import CellId, JsonValue, NestedToolCall, SessionDelegate, ToolDefinition, ToolName
from ._identifiers import normalize_identifier
from ._toolbox import check_unique
from .errors import ToolError


@runtime_checkable
class ToolSource(SessionDelegate, Protocol):
    """A `SessionDelegate` that also says which tools it serves."""

    def definitions(self) -> list[ToolDefinition]:
        """The tools this delegate serves, in the order the model should see them."""
        ...


class CombinedTools:
    """The delegate `combine` returns; itself a tool source."""

    def __init__(self, sources: tuple[ToolSource, ...]) -> None:
        self._sources = sources
        check_unique([d for source in sources for d in source.definitions()])

    def definitions(self) -> list[ToolDefinition]:
        """Every source's definitions, in the order the sources were given."""
        return [definition for definition, _ in self._current()]

    def _current(self) -> list[tuple[ToolDefinition, ToolSource]]:
        identifiers: set[str] = set()
        routes: set[ToolName] = set()
        current = []
        for source in self._sources:
            for definition in source.definitions():
                identifier = normalize_identifier(definition.name)
                if identifier in identifiers or definition.tool_name in routes:
                    continue  # rule 2: only a source that changed later can get here
                identifiers.add(identifier)
                routes.add(definition.tool_name)
                current.append((definition, source))
        return current

    async def invoke_tool(self, call: NestedToolCall) -> JsonValue:
        """Run the call on the source that defined its tool.

        Raises:
            ToolError: as the source raises it, or when no source defined the tool.
        """
        routes = {definition.tool_name: source for definition, source in self._current()}
        source = routes.get(call.tool_name)
        if source is None:
            raise ToolError(f"tool {call.tool_name.name} is not in these toolboxes")
        return await source.invoke_tool(call)

    async def notify(self, call_id: str, cell_id: CellId, text: str) -> None:
        """Hand the notification to every source, concurrently."""
        import trio  # here, not at the top: see Toolbox's tool runner

        async with trio.open_nursery() as nursery:
            for source in self._sources:
                nursery.start_soon(source.notify, call_id, cell_id, text)

    def needs_approval(self, tool: ToolName) -> bool:
        """Whether the source that defines `tool` marks it as needing approval."""
        for definition, source in self._current():
            if definition.tool_name == tool:
                marks = getattr(source, "needs_approval", None)
                return bool(marks(tool)) if callable(marks) else False
        return False

    def cell_closed(self, cell_id: CellId) -> None:
        """Tell every source that the cell is gone."""
        for source in self._sources:
            source.cell_closed(cell_id)

    def __repr__(self) -> str:
        return f"combine({', '.join(map(repr, self._sources))})"


def combine(*sources: ToolSource) -> CombinedTools:
    """Join tool sources (`Toolbox`es, MCP toolboxes, combinations) into one delegate.

    Args:
        *sources: each has `definitions()` and the `SessionDelegate` methods.

    Returns:
        A delegate serving every source's tools, with `definitions()` of its own.

    Raises:
        ValueError: two sources define the same tool name (or names giving the same JavaScript
            identifier, or the same routing name).
    """
    return CombinedTools(sources)
