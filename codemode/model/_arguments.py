"""The arguments of the model's tool calls, decoded with the reference's error texts (7.1, 7.2).

Rules:
1. `wait` takes a JSON object: `cell_id` (string, required), `yield_time_ms` (non-negative
   integer, default 10000), `max_tokens` (non-negative integer or null), `terminate` (boolean,
   default false). Unknown keys are ignored, as the reference does. A refusal reads
   `failed to parse function arguments: {error}`, the error being msgspec's message (for
   instance ``Object missing required field `cell_id` ``).
2. `exec` takes raw text (OpenAI's freeform tool) or `{"code": text}` (Anthropic); anything else
   is refused with `exec expects raw JavaScript source text`.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from ..errors import CodeModeError

DEFAULT_WAIT_YIELD_TIME_MS = 10_000

_Count = Annotated[int, msgspec.Meta(ge=0)]


class ArgumentsError(CodeModeError):
    """The model's tool call had arguments the tool cannot take; the text is for the model."""


class WaitArguments(msgspec.Struct, frozen=True, kw_only=True):
    """The decoded arguments of a `wait` call.

    Parameters:
        cell_id: the cell to observe (or terminate).
        yield_time_ms: the observation window.
        max_tokens: the response's token budget, or None for the default.
        terminate: stop the cell instead of observing it.
    """

    cell_id: str
    yield_time_ms: _Count = DEFAULT_WAIT_YIELD_TIME_MS
    max_tokens: _Count | None = None
    terminate: bool = False


def wait_arguments(payload: Any) -> WaitArguments:
    """Decode a `wait` call's arguments: a JSON text or an already decoded object.

    Raises:
        ArgumentsError: not JSON, or not an object of the right fields (rule 1).
    """
    if isinstance(payload, str | bytes):
        try:
            payload = msgspec.json.decode(payload)
        except msgspec.MsgspecError as error:
            raise ArgumentsError(f"failed to parse function arguments: {error}") from None
    elif not isinstance(payload, dict):
        raise ArgumentsError("wait expects JSON arguments")
    try:
        return msgspec.convert(payload, WaitArguments)
    except msgspec.ValidationError as error:
        raise ArgumentsError(f"failed to parse function arguments: {error}") from None


def exec_text(payload: Any) -> str:
    """The raw text of an `exec` call: the payload itself, or its `code` field.

    Raises:
        ArgumentsError: neither a string nor an object with a string `code` (rule 2).
    """
    if isinstance(payload, str):
        return payload
    if isinstance(payload, dict) and isinstance(payload.get("code"), str):
        return str(payload["code"])
    raise ArgumentsError("exec expects raw JavaScript source text")
