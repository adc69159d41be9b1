"""The value types and interfaces of codemode's public API (design.md, design 4).

Every value type is a frozen `msgspec.Struct` with keyword-only fields, so the same types
serve callers and the wire. Unions are tagged (`type` for content items, the class tag for
responses), so msgspec decodes them without guessing.

Interfaces (`SessionDelegate`, `Session`) are `typing.Protocol`s: the in-process and the process
providers each implement `Session`; the application implements `SessionDelegate`.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, Protocol, TypeAlias

import msgspec

from ._limits import DEFAULT_HEAP_SIZE_BYTES as DEFAULT_HEAP_SIZE_BYTES
from ._limits import DEFAULT_PENDING_OUTPUT_BYTES as DEFAULT_PENDING_OUTPUT_BYTES
from ._limits import DEFAULT_STORED_VALUE_BYTES as DEFAULT_STORED_VALUE_BYTES
from ._limits import MAX_OUTPUT_TOKENS as MAX_OUTPUT_TOKENS
from ._limits import MAX_PENDING_OUTPUT_BYTES as MAX_PENDING_OUTPUT_BYTES
from ._limits import MAX_YIELD_TIME_MS as MAX_YIELD_TIME_MS
from ._limits import AdmissionLimits as AdmissionLimits
from ._limits import CellInfo as CellInfo
from ._limits import CellLimits as CellLimits
from ._limits import SessionUsage as SessionUsage
from ._limits import ToolThreadLimits as ToolThreadLimits
from ._limits import ToolThreadStatistics as ToolThreadStatistics
from ._started import StartedCell as StartedCell
from .errors import InvalidRequestError

CellId: TypeAlias = str
"""A cell's id: `"1"`, `"2"`, ... per session; `"g2:1"` after a host restart."""

JsonValue: TypeAlias = Any
"""Any JSON value (dict, list, str, int, float, bool, None)."""


class _Value(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of the value types: frozen, keyword-only, unknown fields rejected."""


class ToolKind(enum.StrEnum):
    """How a nested tool takes its input."""

    FUNCTION = "function"
    """JSON arguments (an object)."""
    FREEFORM = "freeform"
    """Raw text."""


class ImageDetail(enum.StrEnum):
    """The detail an image is shown to the model with."""

    AUTO = "auto"
    LOW = "low"
    HIGH = "high"
    ORIGINAL = "original"


class ToolName(_Value, frozen=True):
    """The routing name of a tool, as the application knows it.

    Parameters:
        name: the tool's own name.
        namespace: the namespace it belongs to (an MCP server, say), or None.
    """

    name: str
    namespace: str | None = None

    @classmethod
    def plain(cls, name: str) -> ToolName:
        """A tool name without namespace."""
        return cls(name=name)

    @classmethod
    def namespaced(cls, namespace: str, name: str) -> ToolName:
        """A tool name within `namespace`."""
        return cls(name=name, namespace=namespace)


class ToolDefinition(_Value, frozen=True):
    """A nested tool a cell may call as `tools.<identifier>`.

    Parameters:
        name: the model-visible flat name; the JS identifier is `normalize_identifier(name)`.
        tool_name: the routing name handed back in each `NestedToolCall`.
        description: the text shown in `ALL_TOOLS`.
        kind: FUNCTION (JSON arguments) or FREEFORM (text).
        input_schema: JSON Schema of the input, or None.
        output_schema: JSON Schema of the result, or None.
    """

    name: str
    tool_name: ToolName
    description: str = ""
    kind: ToolKind = ToolKind.FUNCTION
    input_schema: JsonValue = None
    output_schema: JsonValue = None


YieldTimeMs: TypeAlias = Annotated[int, msgspec.Meta(ge=0, le=MAX_YIELD_TIME_MS)]
OutputTokens: TypeAlias = Annotated[int, msgspec.Meta(ge=0, le=MAX_OUTPUT_TOKENS)]


def _check_range(name: str, value: int | None, high: int) -> None:
    if value is None:
        return
    # msgspec checks the type only when decoding: a float or a string built by the
    # application would otherwise fail later, elsewhere, or not at all on one provider.
    if type(value) is not int:
        raise InvalidRequestError(f"{name} must be an int, got {type(value).__name__}")
    if not 0 <= value <= high:
        raise InvalidRequestError(f"{name} must be between 0 and {high}, got {value}")


class ExecuteRequest(_Value, frozen=True):
    """Start a cell.

    Parameters:
        tool_call_id: the model's id of the `exec` call; the `call_id` of its notifications.
        source: the JavaScript, evaluated as an ES module.
        enabled_tools: the nested tools, in `ALL_TOOLS` order.
        yield_time_ms: the first observation window (None: 10,000 ms); at least 0.
        max_output_tokens: for the model layer's truncation, 0 to 2^31 - 1; the runtime
            ignores it.

    Raises:
        InvalidRequestError: a number out of range (also when decoded from the wire).
    """

    tool_call_id: str
    source: str
    enabled_tools: list[ToolDefinition] = msgspec.field(default_factory=list)
    yield_time_ms: YieldTimeMs | None = None
    max_output_tokens: OutputTokens | None = None

    def __post_init__(self) -> None:
        # Runs for every execute made or decoded, which mostly set neither field.
        if self.yield_time_ms is not None or self.max_output_tokens is not None:
            _check_range("yield_time_ms", self.yield_time_ms, MAX_YIELD_TIME_MS)
            _check_range("max_output_tokens", self.max_output_tokens, MAX_OUTPUT_TOKENS)


class WaitRequest(_Value, frozen=True):
    """Observe a running cell for up to `yield_time_ms` (at least 0).

    Raises:
        InvalidRequestError: a negative window (also when decoded from the wire).
    """

    cell_id: CellId
    yield_time_ms: YieldTimeMs = 10_000

    def __post_init__(self) -> None:
        _check_range("yield_time_ms", self.yield_time_ms, MAX_YIELD_TIME_MS)


class InputText(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    forbid_unknown_fields=True,
    tag="input_text",
    tag_field="type",
):
    """A text output item."""

    text: str


class InputImage(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    forbid_unknown_fields=True,
    tag="input_image",
    tag_field="type",
):
    """An image output item: a `data:` URL and its detail."""

    image_url: str
    detail: ImageDetail | None = None


ContentItem: TypeAlias = InputText | InputImage


class Yielded(_Value, tag="yielded", frozen=True):
    """The cell is still running; `content_items` is its output since the last response."""

    cell_id: CellId
    content_items: list[ContentItem]
    host_duration: float | None = None


class Terminated(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag="terminated"
):
    """The cell was stopped (terminate or shutdown); its undelivered output."""

    cell_id: CellId
    content_items: list[ContentItem]
    host_duration: float | None = None


class Completed(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag="completed"
):
    """The cell finished; `error_text` is None on success (`exit()` included)."""

    cell_id: CellId
    content_items: list[ContentItem]
    error_text: str | None = None
    host_duration: float | None = None


RuntimeResponse: TypeAlias = Yielded | Terminated | Completed


class Pending(_Value, tag="pending", frozen=True):
    """The cell is paused at its pending frontier (design.md, runtime 5.9): its JavaScript has
    nothing left to run until a tool call settles or a timer fires, and those are held until
    the next observation resumes it. Only `execute_to_pending` and `wait_to_pending` return it.

    Parameters:
        content_items: output since the last response.
        pending_tool_call_ids: the tool calls (`tool-N`) the cell issued since the previous
            frontier; the delegate has seen each already.
    """

    cell_id: CellId
    content_items: list[ContentItem]
    pending_tool_call_ids: list[str]
    host_duration: float | None = None


class LiveCell(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag="live_cell"
):
    """The cell existed and was observed; a `Completed` or `Terminated` response ends it.
    A `Pending` comes only from `wait_to_pending`."""

    response: RuntimeResponse | Pending


class MissingCell(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag="missing_cell"
):
    """No such cell (never existed, already closed, or being terminated)."""

    response: RuntimeResponse


WaitOutcome: TypeAlias = LiveCell | MissingCell


def missing_cell(cell_id: CellId) -> MissingCell:
    """The outcome of observing a cell that is not there."""
    return MissingCell(
        response=Completed(
            cell_id=cell_id, content_items=[], error_text=f"exec cell {cell_id} not found"
        )
    )


class NestedToolCall(_Value, frozen=True):
    """A cell's call of a nested tool, as the delegate receives it.

    Parameters:
        cell_id: the calling cell.
        runtime_tool_call_id: `"tool-1"`, `"tool-2"`, ... per cell in call order.
        tool_name: the `ToolDefinition.tool_name` of the tool called.
        tool_kind: its kind.
        input: the JSON value of the first argument, or None when there was none (or it
            has no JSON form, like `undefined` or a function).
    """

    cell_id: CellId
    runtime_tool_call_id: str
    tool_name: ToolName
    tool_kind: ToolKind
    input: JsonValue = None


class SessionDelegate(Protocol):
    """What the application provides to a session's cells.

    Every method is called on the provider's trio thread, as a task of its nursery.
    """

    async def invoke_tool(self, call: NestedToolCall) -> JsonValue:
        """Run a nested tool; the return value resolves the JS promise.

        Raise `ToolError(text)` to reject it with `text`. When the cell ends first, the
        call is cancelled (`trio.Cancelled`) and a late result is discarded.
        """
        ...

    async def notify(self, call_id: str, cell_id: CellId, text: str) -> None:
        """Deliver a `notify(text)` of the cell started by the `exec` call `call_id`."""
        ...

    def cell_closed(self, cell_id: CellId) -> None:
        """The cell is gone, exactly once per cell, after its last response; must not block."""
        ...


class Session(Protocol):
    """A code-mode session: its cells, their stored values and their limits."""

    @property
    def is_alive(self) -> bool:
        """False once shutdown began (or the host connection was lost)."""
        ...

    async def execute(
        self,
        request: ExecuteRequest,
        delegate: SessionDelegate,
        *,
        observe_initial: bool = True,
        idempotency_key: str | None = None,
    ) -> StartedCell:
        """Admit a cell and start it; returns before its first response.

        `observe_initial=False`: nobody takes the initial observation (the `StartedCell` is
        released already, and dropping it never warns); the cell's next `wait` observes it
        from its start.

        `idempotency_key`: a repeat of this request with the same key returns a `StartedCell`
        of the same cell instead of starting another (docs/python-api.md, "Idempotency
        keys"); every operation below takes one too."""
        ...

    async def wait(
        self, request: WaitRequest, *, idempotency_key: str | None = None
    ) -> WaitOutcome:
        """Observe a cell: new output, its completion, or its termination."""
        ...

    async def terminate(
        self, cell_id: CellId, *, idempotency_key: str | None = None
    ) -> WaitOutcome:
        """Stop a cell and return its undelivered output (or its buffered completion)."""
        ...

    async def shutdown(self) -> None:
        """Terminate every cell and return once each has closed."""
        ...

    async def execute_to_pending(
        self,
        request: ExecuteRequest,
        delegate: SessionDelegate,
        *,
        idempotency_key: str | None = None,
    ) -> Pending | Completed | Terminated:
        """Admit a cell and run it to its pending frontier (or its end); never `Yielded`.

        Cancelled before it returns, it terminates the cell (the caller never had its id)."""
        ...

    async def wait_to_pending(
        self, cell_id: CellId, *, idempotency_key: str | None = None
    ) -> WaitOutcome:
        """Resume a cell and observe it to its next frontier: `LiveCell(Pending | Completed |
        Terminated)`, or `MissingCell`."""
        ...

    async def preempt(self, cell_id: CellId) -> None:
        """Make the cell's active observation (an initial response or a `wait`) return
        `Yielded` now; the cell keeps running. No effect on frontier observers, or when nothing
        observes the cell."""
        ...

    async def cells(self) -> list[CellInfo]:
        """The session's live cells (admitted and not yet closed), oldest first."""
        ...

    async def usage(self) -> SessionUsage:
        """What the session's cells used so far of its budgets (`CellLimits.max_session_*`):
        its tool calls and its CPU time, counted whether or not a budget is set."""
        ...
