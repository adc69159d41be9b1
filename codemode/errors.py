"""The exceptions of codemode, with the reference's exact message texts.

    CodeModeError                    every error codemode raises on purpose
    ├── SessionShuttingDownError     you shut the session down; no new operations
    ├── ProviderClosedError          you closed the provider; its sessions are gone
    ├── ObserverBusyError            another observation of that cell is in progress
    ├── AlreadyTerminatingError      a termination of that cell is in progress
    ├── RuntimeEndedError            the cell's runtime ended without an answer
    ├── InvalidRequestError          the request itself is wrong (limits, ids, sizes)
    │   ├── FrameLimitError          it does not fit in one IPC frame
    │   └── StaleGenerationError     the cell belongs to a host that was replaced
    ├── AdmissionError               the host refused more work for now
    ├── HostLostError                the host died, broke the protocol or failed to start
    │   │                            (the cause is chained when there is one)
    │   └── RuntimeReplacedError     a remote session was reopened on a fresh host
    │                                connection: its stored values and cells are gone
    ├── UnsupportedPlatformError     a provider was opened on a system other than Linux
    └── ToolError                    raised by a delegate's `invoke_tool` to reject the JS
                                     promise with its text

Who caused it decides the class: you (`SessionShuttingDownError`, `ProviderClosedError`,
`InvalidRequestError`), the cell's state (`ObserverBusyError`, `AlreadyTerminatingError`,
`RuntimeEndedError`), the host (`HostLostError`, `AdmissionError`). Both providers raise the same
classes with the same texts: over the wire the host sends a kind beside each error text and the
process provider maps kinds to these classes in one place, never by matching text. Tests and
callers may compare `str(error)` with the reference's texts.
"""

from __future__ import annotations

import enum
import sys


class CodeModeError(Exception):
    """Base class of the errors codemode raises on purpose."""


class SessionShuttingDownError(CodeModeError):
    """The session is shutting down (or shut down): it accepts no new operation."""

    def __init__(self) -> None:
        super().__init__("code mode session is shutting down")


class ProviderClosedError(CodeModeError):
    """The provider was closed by its owner: it has no session and creates none."""

    def __init__(self) -> None:
        super().__init__("the code-mode provider is closed")


class ObserverBusyError(CodeModeError):
    """The cell already has an active observer (a pending `wait` or initial response)."""

    def __init__(self, cell_id: str) -> None:
        super().__init__(f"exec cell {cell_id} already has an active observer")
        self.cell_id = cell_id


class AlreadyTerminatingError(CodeModeError):
    """A `terminate` of the cell is already in progress (or its result was claimed)."""

    def __init__(self, cell_id: str) -> None:
        super().__init__(f"exec cell {cell_id} is already terminating")
        self.cell_id = cell_id


class RuntimeEndedError(CodeModeError):
    """The cell's runtime went away before it answered this observation."""

    def __init__(self, message: str = "exec runtime ended unexpectedly") -> None:
        super().__init__(message)


class InvalidRequestError(CodeModeError, ValueError):
    """The request cannot be served as it is: invalid limits, an unknown or reused session
    id, a value out of range. Also a `ValueError`, so building a request value out of range
    raises it and decoding one from the wire fails."""


class FrameLimitError(InvalidRequestError):
    """The request, or its answer, does not fit in one IPC frame (`IPC frame limit`)."""


class StaleGenerationError(InvalidRequestError):
    """The cell id belongs to an earlier host generation of the session (the host that ran
    the cell was lost and replaced)."""

    def __init__(self, cell_id: str) -> None:
        super().__init__(f"cell {cell_id} belongs to a stale code-mode host generation")
        self.cell_id = cell_id


class AdmissionError(CodeModeError):
    """The host refused the work for now (too many cells, requests or calls)."""


TOO_MANY_REQUESTS = "code-mode host has too many in-flight requests"
TOO_MANY_CELLS = "code-mode host has too many active cells"
TOO_MANY_CALLS = "code-mode host has too many pending delegate calls"


def too_many_uncollected(bound: int) -> str:
    """The text of an execute refused because its session holds `bound` uncollected results."""
    return (
        f"code-mode session has {bound} completed cells whose results were not collected:"
        " wait for or terminate them first"
    )


def time_limit_exceeded(limit_ms: int) -> str:
    """The `error_text` of a cell that ran past `CellLimits.max_wall_time_ms`."""
    return f"exec cell exceeded its time limit of {limit_ms} ms"


def idempotency_key_reused(key: str) -> str:
    """The refusal (`InvalidRequestError`) of a request whose idempotency key names another
    request of the session (docs/python-api.md, "Idempotency keys")."""
    return f"idempotency key {key!r} was already used for a different request"


def initial_response_taken(cell_id: str) -> str:
    """The error of a `StartedCell`'s `initial_response()` once it was awaited or released."""
    return f"the initial response of exec cell {cell_id} was already taken or released"


def tool_call_budget_used_up(budget: int) -> str:
    """The rejection of a tool call made once `max_session_tool_calls` calls were made."""
    return f"session tool call budget of {budget} calls is used up"


def cpu_budget_used_up(budget_ms: int) -> str:
    """The refusal (`AdmissionError`) of an execute once `max_session_cpu_time_ms` is used."""
    return f"session CPU budget of {budget_ms} ms is used up"


class HostLostError(CodeModeError):
    """The host process died, broke the protocol, or failed to start.

    Operations in flight on that host fail with it; the next operation of each session starts
    a new host (and the session's next generation). When the host wrote to stderr before it
    was lost, the text ends with its last lines.
    """


RUNTIME_REPLACED = (
    "The exec runtime was replaced. Stored values and running cells were lost. Prior external"
    " tool operations may have completed; inspect their results before retrying. You may"
    " continue with a fresh exec call."
)
RUNTIME_REPLACED_KEPT = (
    "The exec runtime was replaced. Running cells were lost; stored values were kept. Prior"
    " external tool operations may have completed; inspect their results before retrying. You"
    " may continue with a fresh exec call."
)
"""The text of a replacement of a session that keeps its stored values (docs/durability.md)."""


class RuntimeReplacedError(HostLostError):
    """The connection to a remote session's host was lost; the session was reopened on a
    fresh connection (its next generation), without its stored values and cells.

    The remote provider raises it once, from the first operation of each affected session
    after the loss (also from each operation that was waiting for the reconnection), as the
    reference's gRPC reconnect does (design.md, host 7); the operations after it run on
    the new connection. The operation that raised it did nothing: it is never replayed.
    """

    def __init__(self, text: str = RUNTIME_REPLACED) -> None:
        super().__init__(text)


class UnsupportedPlatformError(CodeModeError):
    """A provider (or the host program) was started on a system other than Linux.

    codemode's providers need Linux: eventfd (the engine's wake-ups), pidfd (the host watches
    its client) and `F_SETPIPE_SZ`. The pure parts (value types, the sans-IO protocol, the
    model layer's formatting) import anywhere.
    """

    def __init__(self, platform: str) -> None:
        super().__init__(
            f"codemode runs only on Linux (it needs eventfd, pidfd and F_SETPIPE_SZ);"
            f" this system is {platform!r}"
        )
        self.platform = platform


def check_platform(platform: str | None = None) -> None:
    """Raise `UnsupportedPlatformError` unless `platform` (default `sys.platform`) is Linux."""
    platform = sys.platform if platform is None else platform
    if not platform.startswith("linux"):
        raise UnsupportedPlatformError(platform)


class ToolError(CodeModeError):
    """Raise from `SessionDelegate.invoke_tool` to reject the JS promise with `text`.

    The cell's `catch (e)` then sees the plain string `text`.
    """

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


HOST_LOST_REASON = "the code-mode host was lost"
"""The reason a tool call is cancelled with when its host is lost (`trio.Cancelled.reason`): the
journal of governed calls (docs/governance.md) tells such a call from one its cell cancelled."""


class ToolDeniedError(ToolError):
    """A nested call its policy denied (`docs/governance.md`): the tool never ran, and the
    cell's promise rejects with an `Error` whose message is `text` (not a plain string)."""


def tool_failure_message(tool_name: str, error: BaseException) -> str:
    """The rejection text of a tool call whose delegate raised something else than ToolError.

    An exception that is not an `Exception` (`SystemExit`, `KeyboardInterrupt`, asyncio's
    `CancelledError`) is named, since its text alone (`2`) says nothing.
    """
    text = str(error)
    name = type(error).__name__
    if not isinstance(error, Exception):
        text = f"{name}: {text}" if text else name
    return f"tool {tool_name} failed: {text or name}"


class ErrorKind(enum.StrEnum):
    """What an error means, carried on the wire beside its text (design.md, design 4)."""

    SHUTTING_DOWN = "shutting_down"
    OBSERVER_BUSY = "observer_busy"
    ALREADY_TERMINATING = "already_terminating"
    RUNTIME_ENDED = "runtime_ended"
    FRAME_LIMIT = "frame_limit"
    INVALID_REQUEST = "invalid_request"
    STALE_GENERATION = "stale_generation"
    ADMISSION = "admission"
    CANCELLED = "cancelled"
    """The operation was cancelled by its caller (`operation/cancel`)."""
    TOOL = "tool"
    """A delegate's rejection, handed to the JavaScript promise as its text."""
    DENIED = "denied"
    """A call its policy denied: the promise rejects with an `Error` of that message (only
    with the tool-denial capability)."""
    INTERNAL = "internal"
    """A failure the caller did not cause (a bug in the host or the delegate)."""


_KINDS: dict[type[CodeModeError], ErrorKind] = {
    SessionShuttingDownError: ErrorKind.SHUTTING_DOWN,
    ObserverBusyError: ErrorKind.OBSERVER_BUSY,
    AlreadyTerminatingError: ErrorKind.ALREADY_TERMINATING,
    RuntimeEndedError: ErrorKind.RUNTIME_ENDED,
    FrameLimitError: ErrorKind.FRAME_LIMIT,
    StaleGenerationError: ErrorKind.STALE_GENERATION,
    InvalidRequestError: ErrorKind.INVALID_REQUEST,
    AdmissionError: ErrorKind.ADMISSION,
    ToolError: ErrorKind.TOOL,
    ToolDeniedError: ErrorKind.DENIED,
}


def error_kind(error: CodeModeError) -> ErrorKind:
    """The kind the host sends beside `error`'s text (the most specific class wins)."""
    for cls in type(error).__mro__:
        kind = _KINDS.get(cls)
        if kind is not None:
            return kind
    return ErrorKind.INTERNAL


def error_from_kind(kind: ErrorKind, message: str, cell_id: str | None = None) -> CodeModeError:
    """The exception a client raises for an error the host sent: the one place that maps
    kinds to classes (httpx `map_httpcore_exceptions`). `cell_id` is the caller's (public)
    id of the cell the request targeted, used in the texts that name it."""
    match kind:
        case ErrorKind.SHUTTING_DOWN:
            return SessionShuttingDownError()
        case ErrorKind.OBSERVER_BUSY if cell_id is not None:
            return ObserverBusyError(cell_id)
        case ErrorKind.ALREADY_TERMINATING if cell_id is not None:
            return AlreadyTerminatingError(cell_id)
        case ErrorKind.RUNTIME_ENDED:
            return RuntimeEndedError(message)
        case ErrorKind.FRAME_LIMIT:
            return FrameLimitError(message)
        case ErrorKind.STALE_GENERATION if cell_id is not None:
            return StaleGenerationError(cell_id)
        case ErrorKind.INVALID_REQUEST:
            return InvalidRequestError(message)
        case ErrorKind.ADMISSION:
            return AdmissionError(message)
        case ErrorKind.TOOL:
            return ToolError(message)
    return CodeModeError(message)
