"""The host's delegate of one execute: a cell's tool calls and notifications forwarded to the
client as reverse calls, and the cell's report sent back with its `cell/closed`.

The runtime calls a tool through `forward_tool` (no task: the answer is a callback, rule 6 of
the runtime's `_calls`), a notification through `notify` (awaited by its task).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from codemode import CodeModeError, JsonValue, NestedToolCall, ToolError
from codemode.errors import ErrorKind, ToolDeniedError
from codemode.observability import (
    CellReport,
    TraceContext,
    emit_host_spans,
    extract,
    lookup,
    record_host_metrics,
    reporting_here,
)
from codemode.protocol import (
    Err,
    NotificationDelivered,
    NotificationSend,
    Ok,
    ToolInvoke,
    ToolResult,
)

if TYPE_CHECKING:
    from codemode_host._requests import DelegateResult, Requests


def _tool_outcome(result: DelegateResult) -> tuple[JsonValue, str | None, bool]:
    """A tool call's answer from the client: (its result, None, False), or (None, the
    rejection, whether it is a denial: an `Error` in the cell)."""
    if not isinstance(result, Ok):  # the common class first: a failed check costs more
        return None, result.message, result.kind is ErrorKind.DENIED
    if not isinstance(result.value, ToolResult):
        return None, "code-mode client returned an invalid tool result", False
    return result.value.result, None, False


class RemoteDelegate:
    """The delegate of one execute: forwards tool calls and notifications to the client.

    A traced execute (its frame carried the client's trace context) gets its cell's report
    sent back with `cell/closed`; a host that reports to OpenTelemetry itself (`--otel`)
    also makes the cell's `code_mode.host.*` spans under that context, and its metrics."""

    def __init__(
        self, requests: Requests, session_id: str, trace: TraceContext | None = None
    ) -> None:
        self._requests = requests
        self._session_id = session_id
        self._trace = trace
        self._telemetry = lookup() if reporting_here() else None
        self.wants_report = trace is not None or self._telemetry is not None
        self._report: CellReport | None = None

    def keep_report(self, report: CellReport) -> None:
        """The runtime's report of the cell, just before its `cell_closed`."""
        if self._trace is not None:
            self._report = report
        if self._telemetry is not None:
            parent = extract(self._trace) if self._trace is not None else None
            emit_host_spans(self._telemetry, report, parent)
            record_host_metrics(self._telemetry, report)

    def forward_tool(
        self, call: NestedToolCall, answer: Callable[[JsonValue, str | None, bool], None]
    ) -> Callable[[], None]:
        """How the runtime calls a tool here (rule 6 of its `_calls`): no task, the answer is
        a callback."""

        def on_result(result: DelegateResult) -> None:
            answer(*_tool_outcome(result))

        request = ToolInvoke(invocation=call)
        return self._requests.forward_call(self._session_id, call.cell_id, request, on_result)

    async def invoke_tool(self, call: NestedToolCall) -> JsonValue:
        """`SessionDelegate`'s way, as a task (the runtime forwards instead)."""
        request = ToolInvoke(invocation=call)
        value, rejection, denied = _tool_outcome(
            await self._requests.call_client(self._session_id, call.cell_id, request)
        )
        if rejection is not None:
            raise ToolDeniedError(rejection) if denied else ToolError(rejection)
        return value

    async def notify(self, call_id: str, cell_id: str, text: str) -> None:
        request = NotificationSend(call_id=call_id, cell_id=cell_id, text=text)
        result = await self._requests.call_client(self._session_id, cell_id, request)
        if isinstance(result, Err):
            raise CodeModeError(result.message)
        if not isinstance(result.value, NotificationDelivered):
            raise CodeModeError("code-mode client returned an invalid notification result")

    def cell_closed(self, cell_id: str) -> None:
        self._requests.cell_closed(self._session_id, cell_id, self._report)
