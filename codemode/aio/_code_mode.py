"""`codemode.aio.CodeMode`: the model's `exec` and `wait` tools for an asyncio application.

Rules:
1. The trio `CodeMode` does the work, over the session's trio session, with the application's
   asyncio delegate run on the loop (`_session` rule 3): the same descriptions, specs, outputs
   and texts.
2. A cancelled `exec` (or `call("exec", ...)`) terminates the cell it started, also when its
   output was ready as the cancellation came: the model never saw the cell's id.
3. A cancelled `wait` whose output was ready keeps it for the next `wait` of that cell (the model
   never saw it): a plain `wait` returns it at once, a `wait` that terminates puts it before its
   own output.
"""

from __future__ import annotations

from asyncio import Future
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, ClassVar

import msgspec

from .. import (
    ApprovalRequest,
    Approve,
    Deny,
    NamespaceDescription,
    SessionDelegate,
    ToolDefinition,
    ToolOutput,
    ToolPolicy,
)
from .. import CodeMode as TrioCodeMode
from ..model import ModelApi
from ._session import AsyncioDelegate, Session, terminate_quietly


class CodeMode:
    """The model-facing `exec` and `wait` tools over one `codemode.aio.Session`.

    Takes the arguments of `codemode.CodeMode`; the delegate is an asyncio object (a `Toolbox`
    whose async tools are asyncio coroutines, say), and so is the `approver` (an asyncio
    coroutine function; the policy's methods run in the trio run). Every method may run
    concurrently.
    """

    tool_names: ClassVar[tuple[str, str]] = TrioCodeMode.tool_names
    """The names `call` dispatches."""

    def __init__(
        self,
        session: Session,
        delegate: SessionDelegate,
        tools: Iterable[ToolDefinition],
        *,
        namespace_descriptions: Mapping[str, NamespaceDescription] | None = None,
        deferred_tools_available: bool = False,
        min_yield_time_ms: int | None = None,
        max_empty_wait_ms: int | None = None,
        policy: ToolPolicy | None = None,
        approver: Callable[[ApprovalRequest], Awaitable[Approve | Deny]] | None = None,
    ) -> None:
        self._session = session
        self._bridge = session._bridge
        on_trio: Callable[[ApprovalRequest], Awaitable[Approve | Deny]] | None = None
        if approver is not None:
            asyncio_approver = approver

            async def asking(request: ApprovalRequest) -> Approve | Deny:
                return await asyncio_approver(request)  # a coroutine, for the asyncio task

            async def on_trio(request: ApprovalRequest) -> Approve | Deny:
                return await self._bridge.run_asyncio(asking, request)

        self._code_mode = TrioCodeMode(
            session.trio_session,
            AsyncioDelegate(delegate, self._bridge),
            tools,
            namespace_descriptions=namespace_descriptions,
            deferred_tools_available=deferred_tools_available,
            min_yield_time_ms=min_yield_time_ms,
            max_empty_wait_ms=max_empty_wait_ms,
            policy=policy,
            approver=on_trio,
        )
        self._parked: dict[str, ToolOutput] = {}

    def exec_description(self) -> str:
        """The `exec` tool's description, with the declarations of the nested tools."""
        return self._code_mode.exec_description()

    def wait_description(self) -> str:
        """The `wait` tool's description."""
        return self._code_mode.wait_description()

    def tool_specs(self, api: ModelApi) -> list[dict[str, Any]]:
        """The `exec` and `wait` tool definitions for `"openai"` or `"anthropic"`."""
        return self._code_mode.tool_specs(api)

    async def call(self, name: str, call_id: str, payload: Any) -> ToolOutput:
        """Run the model's call of `exec` or `wait`, in either API's shape (as
        `codemode.CodeMode.call`).

        Raises:
            ValueError: `name` is not one of `CodeMode.tool_names`.
        """
        if name == "wait":
            return await self.wait(payload, call_id)
        if name not in self.tool_names:
            raise ValueError(f"code mode has no tool named {name!r} (only 'exec' and 'wait')")
        return await self._bridge.call(
            self._code_mode.call, name, call_id, payload, orphan=self._orphaned_exec
        )

    async def exec(self, tool_call_id: str, text: str) -> ToolOutput:
        """Run the model's `exec` call: start a cell and return its first response."""
        return await self._bridge.call(
            self._code_mode.exec, tool_call_id, text, orphan=self._orphaned_exec
        )

    async def wait(self, arguments: Any, tool_call_id: str | None = None) -> ToolOutput:
        """Run the model's `wait` call: observe a cell (or terminate it). `tool_call_id`: the
        call's id, so that a repeat gets the same output (as `codemode.CodeMode.wait`)."""
        cell_id, terminate = _wait_target(arguments)
        parked = self._parked.pop(cell_id, None) if cell_id is not None else None
        if parked is not None and not terminate:
            return parked
        output = await self._bridge.call(
            self._code_mode.wait, arguments, tool_call_id, orphan=self._orphaned_wait
        )
        if parked is None:
            return output
        items = [*output.items[:1], *parked.items[1:], *output.items[1:]]
        return msgspec.structs.replace(output, items=items)

    def _orphaned_exec(self, output: ToolOutput) -> Future[None] | None:
        if output.status != "running" or output.cell_id is None:
            return None
        return self._bridge.submit(terminate_quietly, self._session.trio_session, output.cell_id)

    def _orphaned_wait(self, output: ToolOutput) -> None:
        if output.cell_id is not None and output.status != "error":
            self._parked[output.cell_id] = output


def _wait_target(arguments: Any) -> tuple[str | None, bool]:
    """The cell id and the `terminate` flag of a `wait` call's arguments, when readable (the
    trio `CodeMode` reports malformed ones)."""
    if isinstance(arguments, str | bytes):
        try:
            arguments = msgspec.json.decode(arguments)
        except msgspec.DecodeError:
            return None, False
    if not isinstance(arguments, dict):
        return None, False
    cell_id = arguments.get("cell_id")
    return (cell_id if isinstance(cell_id, str) else None), arguments.get("terminate") is True
