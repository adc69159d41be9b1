"""The `exec` tool's input: raw JavaScript with an optional first-line pragma (reference 7.1).

Rules:
1. The input is JavaScript source, never JSON or a quoted string. A blank input is refused.
2. If its first line, left-trimmed, starts with `// @exec:`, the rest of that line is a JSON
   object with the optional fields `yield_time_ms` and `max_output_tokens` (non-negative
   integers up to 2^53 - 1, or null), and the code is everything after the first newline.
   Otherwise the whole input is the code. An integral float (`1e3`, `1000.0`) counts as that
   integer, as in the `wait` arguments.
3. Each field is also held to the bound `ExecuteRequest` enforces (`MAX_YIELD_TIME_MS`,
   `MAX_OUTPUT_TOKENS`): past it, ``exec pragma field `max_output_tokens` must be at most
   2147483647`` (the reference has no text for it), so the model gets a text it can act on
   rather than the caller an `InvalidRequestError`.
4. Every other refusal is a `PragmaError` with the reference's exact text; where the reference
   quotes its JSON parser, the text quotes msgspec's message instead (for instance
   `JSON is malformed: invalid character (byte 1)` or
   `Expected `int | null`, got `str` - at `$.yield_time_ms``), or for a fractional number
   ``Expected an integer, got 1.5 - at `$.yield_time_ms` ``.

Pure functions, no I/O.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from .._limits import MAX_OUTPUT_TOKENS, MAX_YIELD_TIME_MS
from ..errors import CodeModeError
from ._arguments import NotWholeError, whole_numbers

PRAGMA_PREFIX = "// @exec:"
MAX_SAFE_INTEGER = 2**53 - 1

_BOUNDS = {"yield_time_ms": MAX_YIELD_TIME_MS, "max_output_tokens": MAX_OUTPUT_TOKENS}
"""The most each field may be (rule 3), past the safe-integer check of rule 2."""

_FIELDS = "`yield_time_ms` and `max_output_tokens`"
_BLANK = (
    "exec expects raw JavaScript source text (non-empty). Provide JS only, optionally with "
    'first-line `// @exec: {"yield_time_ms": 10000, "max_output_tokens": 1000}`.'
)
_NO_SOURCE = "exec pragma must be followed by JavaScript source on subsequent lines"
_NOT_AN_OBJECT = f"exec pragma must be a JSON object with supported fields {_FIELDS}"


class PragmaError(CodeModeError):
    """The `exec` input was refused: blank, or a malformed `// @exec:` pragma.

    `str(error)` is the text the model sees.
    """


class ExecSource(msgspec.Struct, frozen=True, kw_only=True):
    """An `exec` input, parsed.

    Parameters:
        code: the JavaScript to run (the pragma line removed).
        yield_time_ms: the pragma's first observation window, or None.
        max_output_tokens: the pragma's token budget for the exec response, or None.
    """

    code: str
    yield_time_ms: int | None = None
    max_output_tokens: int | None = None


_Count = Annotated[int, msgspec.Meta(ge=0)]


class _Pragma(msgspec.Struct, frozen=True):
    yield_time_ms: _Count | None = None
    max_output_tokens: _Count | None = None


def parse_exec_source(text: str) -> ExecSource:
    """Split an `exec` input into its code and its pragma options.

    Args:
        text: the raw input of the model's `exec` call.

    Returns:
        The code and the options (None where the pragma does not set them).

    Raises:
        PragmaError: blank input, or a pragma that is not a JSON object of the supported
            fields with non-negative safe integer values (the texts of reference 7.1).

    >>> parse_exec_source('// @exec: {"yield_time_ms": 10}\\ntext("hi")')
    ExecSource(code='text("hi")', yield_time_ms=10, max_output_tokens=None)
    """
    if not text.strip():
        raise PragmaError(_BLANK)
    first_line, _, rest = text.partition("\n")
    first_line = first_line.lstrip()
    if not first_line.startswith(PRAGMA_PREFIX):
        return ExecSource(code=text)
    if not rest.strip():
        raise PragmaError(_NO_SOURCE)
    pragma = _parse_pragma(first_line[len(PRAGMA_PREFIX) :].strip())
    return ExecSource(
        code=rest, yield_time_ms=pragma.yield_time_ms, max_output_tokens=pragma.max_output_tokens
    )


def _parse_pragma(directive: str) -> _Pragma:
    if not directive:
        raise PragmaError(_NOT_AN_OBJECT)
    try:
        value: Any = msgspec.json.decode(directive)
    except msgspec.MsgspecError as error:
        raise PragmaError(
            f"exec pragma must be valid JSON with supported fields {_FIELDS}: {error}"
        ) from None
    if not isinstance(value, dict):
        raise PragmaError(_NOT_AN_OBJECT)
    for key in value:
        if key not in _Pragma.__struct_fields__:
            raise PragmaError(f"exec pragma only supports {_FIELDS}; got `{key}`")
    try:
        pragma = msgspec.convert(whole_numbers(value, _Pragma.__struct_fields__), _Pragma)
    except (msgspec.ValidationError, NotWholeError) as error:
        raise PragmaError(
            f"exec pragma fields {_FIELDS} must be non-negative safe integers: {error}"
        ) from None
    for field in _Pragma.__struct_fields__:
        number = getattr(pragma, field)
        if number is not None and number > MAX_SAFE_INTEGER:
            raise PragmaError(f"exec pragma field `{field}` must be a non-negative safe integer")
        if number is not None and number > _BOUNDS[field]:
            raise PragmaError(f"exec pragma field `{field}` must be at most {_BOUNDS[field]}")
    return pragma
