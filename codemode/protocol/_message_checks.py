"""The checks the messages' `__post_init__` run (rule 1 of `_messages`): apart from the
message structs, so that the compiled build compiles them (docs/compiled.md; a msgspec Struct
cannot be a compiled class), and every frame decoded on a cell's path calls them as C
functions.

The `check_*_field(s)` functions are themselves the `__post_init__` of the messages whose checks
are only these: msgspec calls a struct's `__post_init__` with the struct as its one argument,
so a compiled function serves as one, and building or decoding such a message costs no frame of
the interpreter (seven a tool call's cell on each side).
"""

from __future__ import annotations

from typing import Any


def check_id_field(message: Any) -> None:
    """`__post_init__` of a message with a request id `id`."""
    check_id(message.id)


def check_session_field(message: Any) -> None:
    """`__post_init__` of a message with a `session_id`."""
    check_session_id(message.session_id)


def check_id_and_session_fields(message: Any) -> None:
    """`__post_init__` of a message with both."""
    check_id(message.id)
    check_session_id(message.session_id)


def check_id(request_id: int) -> None:
    if request_id < 1:
        raise ValueError(f"code-mode request IDs start at 1, got {request_id}")


def check_session_id(session_id: str) -> None:
    if not session_id:
        raise ValueError("invalid code-mode session ID: empty")


def check_versions(versions: list[int]) -> None:
    if not versions:
        raise ValueError("supported protocol versions must not be empty")
    if any(version < 1 for version in versions):
        raise ValueError(f"protocol versions must be positive, got {versions}")
    if len(set(versions)) != len(versions):
        raise ValueError(f"supported protocol versions must not repeat, got {versions}")


def check_capabilities(capabilities: list[str]) -> None:
    if any(not capability.strip() for capability in capabilities):
        raise ValueError("a code-mode capability must not be blank")
    if len(set(capabilities)) != len(capabilities):
        raise ValueError(f"code-mode capabilities must not repeat, got {capabilities}")
