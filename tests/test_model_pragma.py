"""The `exec` input and its pragma (reference 7.1, tests of 9.8), every refusal text exact."""

from __future__ import annotations

import pytest

from codemode import ExecSource, PragmaError, parse_exec_source

FIELDS = "`yield_time_ms` and `max_output_tokens`"


def test_parse_exec_source_without_pragma() -> None:
    assert parse_exec_source("text('hi')") == ExecSource(code="text('hi')")


def test_parse_exec_source_with_pragma() -> None:
    assert parse_exec_source("// @exec: {\"yield_time_ms\": 10}\ntext('hi')") == ExecSource(
        code="text('hi')", yield_time_ms=10
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '  \t// @exec: {"yield_time_ms": 0, "max_output_tokens": 7}\r\na()\nb()',
            ExecSource(code="a()\nb()", yield_time_ms=0, max_output_tokens=7),
        ),
        (
            '// @exec: {"yield_time_ms": null, "max_output_tokens": null}\nx',
            ExecSource(code="x"),
        ),
        (
            f'// @exec: {{"yield_time_ms": {2**53 - 1}, "max_output_tokens": {2**31 - 1}}}\nx',
            ExecSource(code="x", yield_time_ms=2**53 - 1, max_output_tokens=2**31 - 1),
        ),
        # Integral floats, as models write them, count as their integers.
        (
            '// @exec: {"yield_time_ms": 1e3, "max_output_tokens": 500.0}\nx',
            ExecSource(code="x", yield_time_ms=1000, max_output_tokens=500),
        ),
        # Not a pragma: the whole input is the code.
        ("x = 1 // @exec: {}\ny", ExecSource(code="x = 1 // @exec: {}\ny")),
        ("// @exec {}\ny", ExecSource(code="// @exec {}\ny")),
        ("\n// @exec: {}\ny", ExecSource(code="\n// @exec: {}\ny")),
    ],
)
def test_parse_exec_source_cases(text: str, expected: ExecSource) -> None:
    assert parse_exec_source(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            " \n\t ",
            "exec expects raw JavaScript source text (non-empty). Provide JS only, optionally with "
            'first-line `// @exec: {"yield_time_ms": 10000, "max_output_tokens": 1000}`.',
        ),
        (
            '// @exec: {"yield_time_ms": 1}',
            "exec pragma must be followed by JavaScript source on subsequent lines",
        ),
        (
            '// @exec: {"yield_time_ms": 1}\n  \n',
            "exec pragma must be followed by JavaScript source on subsequent lines",
        ),
        ("// @exec:   \nx", f"exec pragma must be a JSON object with supported fields {FIELDS}"),
        ("// @exec: [1]\nx", f"exec pragma must be a JSON object with supported fields {FIELDS}"),
        ("// @exec: 5\nx", f"exec pragma must be a JSON object with supported fields {FIELDS}"),
        (
            "// @exec: {yield_time_ms: 1}\nx",
            f"exec pragma must be valid JSON with supported fields {FIELDS}: JSON is malformed: object keys must be strings (byte 1)",
        ),
        (
            '// @exec: {"yield_time_ms": 1\nx',
            f"exec pragma must be valid JSON with supported fields {FIELDS}: Input data was truncated",
        ),
        ('// @exec: {"timeout": 1}\nx', f"exec pragma only supports {FIELDS}; got `timeout`"),
        (
            '// @exec: {"yield_time_ms": 1, "b": 2, "a": 3}\nx',
            f"exec pragma only supports {FIELDS}; got `b`",
        ),
        (
            '// @exec: {"yield_time_ms": "10"}\nx',
            f"exec pragma fields {FIELDS} must be non-negative safe integers: "
            "Expected `int | null`, got `str` - at `$.yield_time_ms`",
        ),
        (
            '// @exec: {"max_output_tokens": -1}\nx',
            f"exec pragma fields {FIELDS} must be non-negative safe integers: "
            "Expected `int` >= 0 - at `$.max_output_tokens`",
        ),
        (
            '// @exec: {"yield_time_ms": 1.5}\nx',
            f"exec pragma fields {FIELDS} must be non-negative safe integers: "
            "Expected an integer, got 1.5 - at `$.yield_time_ms`",
        ),
        (
            '// @exec: {"max_output_tokens": -1e3}\nx',
            f"exec pragma fields {FIELDS} must be non-negative safe integers: "
            "Expected `int` >= 0 - at `$.max_output_tokens`",
        ),
        # Past ExecuteRequest's bound though a safe integer: refused here, not by the request.
        (
            f'// @exec: {{"max_output_tokens": {2**31}}}\nx',
            f"exec pragma field `max_output_tokens` must be at most {2**31 - 1}",
        ),
        (
            '// @exec: {"max_output_tokens": 3e9}\nx',
            f"exec pragma field `max_output_tokens` must be at most {2**31 - 1}",
        ),
        (
            '// @exec: {"yield_time_ms": true}\nx',
            f"exec pragma fields {FIELDS} must be non-negative safe integers: "
            "Expected `int | null`, got `bool` - at `$.yield_time_ms`",
        ),
        (
            f'// @exec: {{"yield_time_ms": {2**53}}}\nx',
            "exec pragma field `yield_time_ms` must be a non-negative safe integer",
        ),
        (
            f'// @exec: {{"max_output_tokens": {2**70}}}\nx',
            "exec pragma field `max_output_tokens` must be a non-negative safe integer",
        ),
    ],
)
def test_parse_exec_source_refusals(text: str, message: str) -> None:
    with pytest.raises(PragmaError) as caught:
        parse_exec_source(text)
    assert str(caught.value) == message
