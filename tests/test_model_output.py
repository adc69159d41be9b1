"""Response formatting (reference 7.3): status line, wall time, output, script error, success."""

from __future__ import annotations

import pytest

from codemode import (
    Completed,
    ContentItem,
    InputText,
    RuntimeResponse,
    Terminated,
    ToolOutput,
    Yielded,
)
from codemode.model._output import Status, error_output, format_response, header

TEXT = InputText(text="out")


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [(0.0, "0.0"), (0.04, "0.0"), (0.05, "0.1"), (0.149, "0.1"), (1.25, "1.3"), (12.0, "12.0")],
)
def test_wall_time_is_rounded_half_up_to_one_decimal(seconds: float, expected: str) -> None:
    assert header("Script completed", seconds) == (
        f"Script completed\nWall time {expected} seconds\nOutput:\n"
    )


@pytest.mark.parametrize(
    ("response", "status_line", "status", "success"),
    [
        (Yielded(cell_id="7", content_items=[TEXT]), "Script running with cell ID 7", "running", True),
        (Terminated(cell_id="7", content_items=[TEXT]), "Script terminated", "terminated", True),
        (Completed(cell_id="7", content_items=[TEXT]), "Script completed", "completed", True),
        (Completed(cell_id="7", content_items=[TEXT], error_text="boom"), "Script failed", "failed", False),
    ],
)  # fmt: skip
def test_statuses(
    response: RuntimeResponse, status_line: str, status: Status, success: bool
) -> None:
    output = format_response(
        response, response.content_items, wall_time=0.0, max_tokens=None, tool="wait"
    )
    expected_items: list[ContentItem] = [
        InputText(text=f"{status_line}\nWall time 0.0 seconds\nOutput:\n"),
        TEXT,
    ]
    if status == "failed":
        expected_items.append(InputText(text="Script error:\nboom"))
    assert output == ToolOutput(
        items=expected_items, success=success, status=status, cell_id="7", tool="wait"
    )


def test_the_script_error_is_truncated_with_the_output_but_not_the_header() -> None:
    response = Completed(cell_id="1", content_items=[InputText(text="x" * 40)], error_text="e")
    output = format_response(
        response, response.content_items, wall_time=0.31, max_tokens=5, tool="exec"
    )
    assert output.items == [
        InputText(text="Script failed\nWall time 0.3 seconds\nOutput:\n"),
        InputText(
            text="Warning: truncated output (original token count: 14)\nTotal output lines: 3\n\n"
            "xxxxxxxxxx…9 tokens truncated…t error:\ne"
        ),
    ]


def test_the_default_budget_is_ten_thousand_tokens() -> None:
    response = Completed(cell_id="1", content_items=[InputText(text="y" * 40_000)])
    fits = format_response(
        response, response.content_items, wall_time=0, max_tokens=None, tool="exec"
    )
    assert fits.items[1:] == response.content_items
    longer = Completed(cell_id="1", content_items=[InputText(text="y" * 40_001)])
    cut = format_response(longer, longer.content_items, wall_time=0, max_tokens=None, tool="exec")
    assert cut.items[1].text.startswith("Warning: truncated output (original token count: 10001)")  # type: ignore[union-attr]


def test_error_output() -> None:
    assert error_output("nope", tool="wait", cell_id="2") == ToolOutput(
        items=[InputText(text="nope")], success=False, status="error", cell_id="2", tool="wait"
    )
    assert error_output("nope", tool="exec").text == "nope"


def test_tool_output_is_a_frozen_value() -> None:
    output = error_output("x", tool="exec")
    with pytest.raises(AttributeError):
        output.success = True  # type: ignore[misc]
    assert output.tool == "exec"
    assert output.cell_id is None
    assert ToolOutput.__struct_fields__ == ("items", "success", "status", "cell_id", "tool")
