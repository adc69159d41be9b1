"""The exceptions of codemode, with the reference's exact message texts.

    CodeModeError                    every error codemode raises on purpose
    ├── SessionShuttingDownError     you shut the session down; no new cells
    ├── ObserverBusyError            another observation of that cell is in progress
    ├── AlreadyTerminatingError      a termination of that cell is in progress
    ├── RuntimeEndedError            the cell's runtime ended without an answer
    └── ToolError                    raised by a delegate's `invoke_tool` to reject the JS
                                     promise with its text

Tests and callers may compare `str(error)` with the reference's texts.
"""

from __future__ import annotations

import re


class CodeModeError(Exception):
    """Base class of the errors codemode raises on purpose."""


class SessionShuttingDownError(CodeModeError):
    """The session is shutting down (or shut down): it admits no new cell."""

    def __init__(self) -> None:
        super().__init__("code mode session is shutting down")


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


class ToolError(CodeModeError):
    """Raise from `SessionDelegate.invoke_tool` to reject the JS promise with `text`.

    The cell's `catch (e)` then sees the plain string `text`.
    """

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


def tool_failure_message(tool_name: str, error: BaseException) -> str:
    """The rejection text of a tool call whose delegate raised something else than ToolError."""
    return f"tool {tool_name} failed: {str(error) or type(error).__name__}"


_TYPED_MESSAGES: list[tuple[re.Pattern[str], type[CodeModeError]]] = [
    (re.compile(r"^exec cell (.+) already has an active observer$"), ObserverBusyError),
    (re.compile(r"^exec cell (.+) is already terminating$"), AlreadyTerminatingError),
]


def error_from_message(message: str) -> CodeModeError:
    """The typed error a message from the host stands for (a plain CodeModeError otherwise),
    so callers see the same exception types with either provider."""
    if message == "code mode session is shutting down":
        return SessionShuttingDownError()
    if message == "exec runtime ended unexpectedly":
        return RuntimeEndedError()
    for pattern, error_type in _TYPED_MESSAGES:
        match = pattern.match(message)
        if match:
            return error_type(match.group(1))
    return CodeModeError(message)
