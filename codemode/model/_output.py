"""What the model sees back from `exec` and `wait`, and its shape in each model API (7.3).

Rules:
1. A response becomes: a header item `{status}\\nWall time {secs:.1f} seconds\\nOutput:\\n`, then
   the cell's output items (images checked by the caller first), then for a failed cell a
   `Script error:\\n{error_text}` item; everything but the header is cut to the token budget.
2. The status line: `Script running with cell ID {id}` (Yielded), `Script terminated`,
   `Script completed`, `Script failed` (a Completed with an error, MissingCell's too).
3. Success: true for a running or terminated cell, and for a cell that completed without an
   error. A tool-level error (no cell response at all) is one text item, `success` false.
4. `to_openai` gives a Responses API input item (`custom_tool_call_output` for `exec`, the
   freeform tool, `function_call_output` for `wait`); `to_anthropic` gives a Messages API
   `tool_result` block with text and base64 image blocks (empty texts dropped, which that API
   refuses) and `is_error` set when not successful.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import msgspec

from .._api import Completed, ContentItem, ImageDetail, InputText, RuntimeResponse, Yielded
from ._images import decode_data_url, sniff_media_type
from ._truncation import truncate_items

DEFAULT_MAX_TOKENS = 10_000
"""The token budget of a response when the model sets none."""

Status = Literal["running", "completed", "failed", "terminated", "error"]
ToolKindName = Literal["exec", "wait"]


class ToolOutput(msgspec.Struct, frozen=True, kw_only=True):
    """The result of one `exec` or `wait` call, as the model sees it.

    Parameters:
        items: the content items, the header first (a tool-level error is one text item).
        success: whether the call succeeded (reference 7.3; false for a tool-level error).
        status: `running` (the cell yielded), `completed`, `failed`, `terminated`, or `error`
            (a tool-level error with no cell response: a refused pragma, bad `wait`
            arguments, a busy cell, ...).
        cell_id: the cell the response is about, whenever it is known.
        tool: the tool that produced it, which decides its shape in `to_openai`.
    """

    items: list[ContentItem]
    success: bool
    status: Status
    cell_id: str | None = None
    tool: ToolKindName = "exec"

    @property
    def text(self) -> str:
        """The text items joined by newlines (images left out): a quick look for logs."""
        return "\n".join(item.text for item in self.items if isinstance(item, InputText))

    def to_openai(self, call_id: str) -> dict[str, Any]:
        """The Responses API input item that answers the model's call `call_id`."""
        kind = "custom_tool_call_output" if self.tool == "exec" else "function_call_output"
        return {"type": kind, "call_id": call_id, "output": [_openai_item(i) for i in self.items]}

    def to_anthropic(self, tool_use_id: str) -> dict[str, Any]:
        """The Messages API `tool_result` block that answers the `tool_use` `tool_use_id`."""
        blocks = [_anthropic_block(item) for item in self.items]
        return {
            "type": "tool_result",
            "tool_use_id": tool_use_id,
            "content": [block for block in blocks if block is not None],
            "is_error": not self.success,
        }


def _openai_item(item: ContentItem) -> dict[str, Any]:
    if isinstance(item, InputText):
        return {"type": "input_text", "text": item.text}
    detail = item.detail or ImageDetail.HIGH
    return {"type": "input_image", "image_url": item.image_url, "detail": str(detail)}


def _anthropic_block(item: ContentItem) -> dict[str, Any] | None:
    if isinstance(item, InputText):
        return {"type": "text", "text": item.text} if item.text else None
    data = decode_data_url(item.image_url)
    media_type = sniff_media_type(data) if data is not None else None
    if media_type is None:
        # Only reachable for items that did not come through a CodeMode response.
        return {"type": "text", "text": "image content omitted because it could not be processed"}
    payload = item.image_url.partition(",")[2]
    return {
        "type": "image",
        "source": {"type": "base64", "media_type": media_type, "data": payload},
    }


def status_line(response: RuntimeResponse) -> str:
    """The first line of the header (rule 2)."""
    if isinstance(response, Yielded):
        return f"Script running with cell ID {response.cell_id}"
    if isinstance(response, Completed):
        return "Script completed" if response.error_text is None else "Script failed"
    return "Script terminated"


def _status(response: RuntimeResponse) -> Status:
    if isinstance(response, Yielded):
        return "running"
    if isinstance(response, Completed):
        return "completed" if response.error_text is None else "failed"
    return "terminated"


def header(status: str, wall_time: float) -> str:
    """The header item's text for a status line and a wall time in seconds."""
    # Rounded half away from zero, like the reference's `f32::round`, then one decimal.
    tenths = math.floor(wall_time * 10 + 0.5) / 10
    return f"{status}\nWall time {tenths:.1f} seconds\nOutput:\n"


def format_response(
    response: RuntimeResponse,
    items: Sequence[ContentItem],
    *,
    wall_time: float,
    max_tokens: int | None,
    tool: ToolKindName,
    trailer: Sequence[ContentItem] = (),
) -> ToolOutput:
    """The model's view of a response (rules 1-3).

    Args:
        response: the runtime's response (a MissingCell's inner response included).
        items: its content items, images already checked (`prepare_images`).
        wall_time: seconds since the tool call's handler started.
        max_tokens: the token budget (None: `DEFAULT_MAX_TOKENS`).
        tool: the tool that produced it.
        trailer: items after the output and the error (the journal line of a cell that
            stopped short), truncated with them.
    """
    body = list(items)
    if isinstance(response, Completed) and response.error_text is not None:
        body.append(InputText(text=f"Script error:\n{response.error_text}"))
    body.extend(trailer)
    budget = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
    body = truncate_items(body, budget)
    top = InputText(text=header(status_line(response), wall_time))
    status = _status(response)
    return ToolOutput(
        items=[top, *body],
        success=status != "failed",
        status=status,
        cell_id=response.cell_id,
        tool=tool,
    )


def error_output(text: str, *, tool: ToolKindName, cell_id: str | None = None) -> ToolOutput:
    """A tool-level error: the text alone, unsuccessful (rule 3)."""
    return ToolOutput(
        items=[InputText(text=text)], success=False, status="error", cell_id=cell_id, tool=tool
    )
