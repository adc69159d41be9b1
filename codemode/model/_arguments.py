"""The arguments of the model's tool calls, decoded with the reference's error texts (7.1, 7.2).

Rules:
1. `wait` takes a JSON object: `cell_id` (string, required), `yield_time_ms` (integer from 0 to
   `MAX_YIELD_TIME_MS`, default 10000), `max_tokens` (integer from 0 to `MAX_OUTPUT_TOKENS`, or
   null), `terminate` (boolean, default false): the bounds `WaitRequest` and `ExecuteRequest`
   enforce. Unknown keys are ignored, as the reference does. A refusal reads
   `failed to parse function arguments: {error}`, the error being msgspec's message (for
   instance ``Object missing required field `cell_id` ``).
2. The tool spec types the numbers as JSON `number`, and models write `1000.0` or `1e3`: an
   integral float counts as that integer; any other float is refused with
   ``Expected an integer, got 1.5 - at `$.yield_time_ms` ``.
3. `exec` takes raw text (OpenAI's freeform tool) or `{"code": text}` (Anthropic); anything else
   is refused with `exec expects raw JavaScript source text`.
4. Strings from the model are repaired, never refused: a lone surrogate (what an SDK's JSON
   decoder makes of a `"\\ud83d"` escape) becomes U+FFFD (`codemode._text.well_formed`), as
   JavaScript strings leaving a cell do, so every provider sees the same well-formed text and
   none fails to encode it. (A JSON text holding such an escape is refused by msgspec's parser
   first: ``JSON is malformed: unexpected end of escaped utf-16 surrogate pair``.)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any

import msgspec

from .._limits import MAX_OUTPUT_TOKENS, MAX_YIELD_TIME_MS
from .._text import well_formed
from ..errors import CodeModeError

DEFAULT_WAIT_YIELD_TIME_MS = 10_000

_YieldTimeMs = Annotated[int, msgspec.Meta(ge=0, le=MAX_YIELD_TIME_MS)]
_Tokens = Annotated[int, msgspec.Meta(ge=0, le=MAX_OUTPUT_TOKENS)]


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
    yield_time_ms: _YieldTimeMs = DEFAULT_WAIT_YIELD_TIME_MS
    max_tokens: _Tokens | None = None
    terminate: bool = False


def wait_arguments(payload: Any) -> WaitArguments:
    """Decode a `wait` call's arguments: a JSON text or an already decoded object; its
    `cell_id` made well-formed (rule 4).

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
        if isinstance(payload, dict):
            payload = whole_numbers(payload, ("yield_time_ms", "max_tokens"))
        arguments = msgspec.convert(payload, WaitArguments)
    except (msgspec.ValidationError, NotWholeError) as error:
        raise ArgumentsError(f"failed to parse function arguments: {error}") from None
    cell_id = well_formed(arguments.cell_id)
    if cell_id is arguments.cell_id:
        return arguments
    return msgspec.structs.replace(arguments, cell_id=cell_id)


class NotWholeError(ValueError):
    """A number field held a float with a fractional part (or an infinity, or NaN)."""


def whole_numbers(value: dict[Any, Any], fields: Iterable[str]) -> dict[Any, Any]:
    """`value`, with each of `fields` that holds an integral float (`1000.0`, `1e3`) made that
    integer (rule 2); `value` itself when there is none.

    Raises:
        NotWholeError: one of `fields` holds any other float (``Expected an integer, got 1.5 -
            at `$.field` ``).
    """
    changed: dict[Any, Any] | None = None
    for field in fields:
        number = value.get(field)
        if not isinstance(number, float):
            continue
        if not number.is_integer():
            raise NotWholeError(f"Expected an integer, got {number!r} - at `$.{field}`")
        changed = changed if changed is not None else dict(value)
        changed[field] = int(number)
    return value if changed is None else changed


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
