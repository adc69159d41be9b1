"""A recording delegate for runtime and host tests, like the seed's.

It answers every tool call with `{"value": "output"}` unless told otherwise, and records tool
invocations, notifications, cancellations and closed cells. Tests synchronise on what it
recorded with `await delegate.until(predicate)`, never on sleeps.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from codemode import JsonValue, NestedToolCall

ToolBehaviour = Callable[[NestedToolCall], Awaitable[JsonValue]]


class RecordingDelegate:
    def __init__(self, on_tool: ToolBehaviour | None = None) -> None:
        self.on_tool = on_tool
        self.invocations: list[NestedToolCall] = []
        self.notifications: list[tuple[str, str, str]] = []
        self.closed: list[str] = []
        self.cancelled_tools: list[str] = []
        self.cancelled_notifications: list[str] = []
        self.hold_tools = False
        self.hold_notifications = False
        self.release = trio.Event()
        self.slow_cleanup: trio.Event | None = None
        """When set, a cancelled tool call shields its cleanup until this event is set."""
        self._changed = trio.Event()

    def _record(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def until(self, predicate: Callable[[], bool]) -> None:
        """Wait until `predicate()` holds; it is checked after every recorded change."""
        while not predicate():
            await self._changed.wait()

    async def invoke_tool(self, call: NestedToolCall) -> JsonValue:
        self.invocations.append(call)
        self._record()
        try:
            if self.hold_tools:
                await self.release.wait()
            result = {"value": "output"} if self.on_tool is None else await self.on_tool(call)
        except trio.Cancelled:
            self.cancelled_tools.append(call.runtime_tool_call_id)
            self._record()
            if self.slow_cleanup is not None:
                # Bounded, so that a failing test cannot hang the suite's teardown.
                with trio.CancelScope(shield=True), trio.move_on_after(5):
                    await self.slow_cleanup.wait()
            raise
        return result

    async def notify(self, call_id: str, cell_id: str, text: str) -> None:
        self.notifications.append((call_id, cell_id, text))
        self._record()
        try:
            if self.hold_notifications:
                await self.release.wait()
        except trio.Cancelled:
            self.cancelled_notifications.append(text)
            self._record()
            raise

    def cell_closed(self, cell_id: str) -> None:
        self.closed.append(cell_id)
        self._record()
