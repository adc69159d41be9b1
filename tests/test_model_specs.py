"""Tool specs and results in each model API's shape, checked against the SDKs' own types.

Every dict is validated strictly (no coercion, unknown keys rejected) against the `openai`
and `anthropic` SDK types, and must come back unchanged from a round trip through them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from anthropic.types import MessageParam, ToolParam, ToolResultBlockParam, ToolUnionParam
from openai.types.responses import (
    CustomTool,
    CustomToolParam,
    FunctionTool,
    FunctionToolParam,
    ResponseCustomToolCallOutput,
    ResponseCustomToolCallOutputParam,
    ResponseInputItemParam,
)
from openai.types.responses import ToolParam as OpenAIToolParam
from openai.types.responses.response_input_item import FunctionCallOutput
from openai.types.responses.response_input_item_param import (
    FunctionCallOutput as FunctionCallOutputParam,
)
from pydantic import BaseModel, TypeAdapter, ValidationError

from codemode import ImageDetail, InputImage, InputText, ToolDefinition, ToolName, ToolOutput
from codemode.model import EXEC_GRAMMAR, WAIT_PARAMETERS, exec_description, tool_specs
from codemode.model import wait_description as wait_tool_description
from tests.test_model_images import data_url, encoded, png_data_url

UPDATE_PLAN = ToolDefinition(
    name="update_plan", tool_name=ToolName.plain("update_plan"), description="Update the plan"
)

GRAMMAR = r"""
start: pragma_source | plain_source
pragma_source: PRAGMA_LINE NEWLINE SOURCE
plain_source: SOURCE

PRAGMA_LINE: /[ \t]*\/\/ @exec:[^\r\n]*/
NEWLINE: /\r?\n/
SOURCE: /[\s\S]+/
"""


def materialized(value: Any) -> Any:
    """`value` with the SDK's lazily validated iterables run to the end (which validates)."""
    if isinstance(value, dict):
        return {key: materialized(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [materialized(item) for item in value]
    if isinstance(value, Iterator):
        return [materialized(item) for item in value]
    return value


def check_typed_dict(sdk_type: Any, value: dict[str, Any]) -> None:
    adapter: TypeAdapter[Any] = TypeAdapter(sdk_type)
    validated = adapter.validate_python(value, strict=True, extra="forbid")
    assert materialized(validated) == value


def check_model(model: type[BaseModel], value: dict[str, Any]) -> None:
    parsed = model.model_validate(value, strict=True, extra="forbid")
    assert parsed.model_dump(mode="json", exclude_unset=True) == value


def test_the_checks_can_fail() -> None:
    spec = tool_specs("openai", [])[0]
    with pytest.raises(ValidationError):
        check_typed_dict(CustomToolParam, {**spec, "unexpected": 1})
    with pytest.raises(ValidationError):
        check_model(CustomTool, {**spec, "format": {**spec["format"], "unexpected": 1}})
    with pytest.raises(ValidationError):
        check_typed_dict(FunctionToolParam, {**tool_specs("openai", [])[1], "strict": "no"})
    result = ToolOutput(items=[InputText(text="x")], success=True, status="completed")
    item = result.to_openai("c")
    item["output"][0]["unexpected"] = 1
    with pytest.raises(ValidationError):
        check_typed_dict(ResponseInputItemParam, item)
    block = result.to_anthropic("t")
    block["content"][0]["unexpected"] = 1
    with pytest.raises(ValidationError):
        check_typed_dict(ToolResultBlockParam, block)


def test_create_wait_tool_matches_expected_spec() -> None:
    assert tool_specs("openai", [])[1] == {
        "type": "function",
        "name": "wait",
        "description": "Waits on a yielded `exec` cell and returns new output or completion.\n"
        + wait_tool_description().partition("\n")[2].strip(),
        "strict": False,
        "parameters": {
            "type": "object",
            "properties": {
                "cell_id": {
                    "type": "string",
                    "description": "Identifier of the running exec cell.",
                },
                "max_tokens": {
                    "type": "number",
                    "description": "Output token budget for this wait call. Defaults to 10000 tokens.",
                },
                "terminate": {
                    "type": "boolean",
                    "description": "True stops the running exec cell; false or omitted waits for output.",
                },
                "yield_time_ms": {
                    "type": "number",
                    "description": "Wait before yielding more output. Defaults to 10000 ms.",
                },
            },
            "required": ["cell_id"],
            "additionalProperties": False,
        },
    }


def test_create_code_mode_tool_matches_expected_spec() -> None:
    assert tool_specs("openai", [UPDATE_PLAN])[0] == {
        "type": "custom",
        "name": "exec",
        "description": exec_description([UPDATE_PLAN]),
        "format": {"type": "grammar", "syntax": "lark", "definition": GRAMMAR},
    }
    assert EXEC_GRAMMAR == GRAMMAR


def test_anthropic_specs() -> None:
    exec_spec, wait_spec = tool_specs("anthropic", [UPDATE_PLAN], deferred_tools_available=True)
    assert exec_spec == {
        "name": "exec",
        "description": exec_description([UPDATE_PLAN], deferred_tools_available=True),
        "input_schema": {
            "type": "object",
            "properties": {
                "code": {
                    "type": "string",
                    "description": "Raw JavaScript source; its first line may be the `// @exec:` pragma.",
                }
            },
            "required": ["code"],
            "additionalProperties": False,
        },
    }
    assert wait_spec == {
        "name": "wait",
        "description": wait_tool_description(),
        "input_schema": WAIT_PARAMETERS,
    }


def test_specs_are_fresh_copies() -> None:
    first = tool_specs("openai", [])
    first[1]["parameters"]["properties"].clear()
    tool_specs("anthropic", [])[1]["input_schema"]["required"].append("x")
    assert tool_specs("openai", [])[1]["parameters"] == WAIT_PARAMETERS
    assert WAIT_PARAMETERS["required"] == ["cell_id"]
    assert len(WAIT_PARAMETERS["properties"]) == 4


def test_unknown_api_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown model API 'gemini'"):
        tool_specs("gemini", [])  # type: ignore[arg-type]


def test_openai_specs_pass_the_sdk_types() -> None:
    exec_spec, wait_spec = tool_specs("openai", [UPDATE_PLAN])
    check_typed_dict(CustomToolParam, exec_spec)
    check_typed_dict(FunctionToolParam, wait_spec)
    check_typed_dict(OpenAIToolParam, exec_spec)
    check_typed_dict(OpenAIToolParam, wait_spec)
    check_model(CustomTool, exec_spec)
    check_model(FunctionTool, wait_spec)


def test_anthropic_specs_pass_the_sdk_types() -> None:
    for spec in tool_specs("anthropic", [UPDATE_PLAN]):
        check_typed_dict(ToolParam, spec)
        check_typed_dict(ToolUnionParam, spec)


def outputs() -> list[ToolOutput]:
    header = InputText(text="Script completed\nWall time 0.0 seconds\nOutput:\n")
    png = InputImage(image_url=png_data_url(), detail=ImageDetail.ORIGINAL)
    jpeg = InputImage(image_url=data_url(encoded("JPEG", 2, 2), "image/jpeg"))
    return [
        ToolOutput(items=[header, InputText(text="hi")], success=True, status="completed"),
        ToolOutput(
            items=[header, png, InputText(text=""), jpeg],
            success=False,
            status="failed",
            cell_id="3",
        ),
        ToolOutput(items=[InputText(text="bad")], success=False, status="error", tool="wait"),
        ToolOutput(items=[header, png], success=True, status="running", cell_id="1", tool="wait"),
    ]


@pytest.mark.parametrize("output", outputs())
def test_openai_results_pass_the_sdk_types(output: ToolOutput) -> None:
    item = output.to_openai("call_1")
    check_typed_dict(ResponseInputItemParam, item)
    if output.tool == "exec":
        assert item["type"] == "custom_tool_call_output"
        check_typed_dict(ResponseCustomToolCallOutputParam, item)
        check_model(ResponseCustomToolCallOutput, item)
    else:
        assert item["type"] == "function_call_output"
        check_typed_dict(FunctionCallOutputParam, item)
        check_model(FunctionCallOutput, item)
    assert item["call_id"] == "call_1"
    assert len(item["output"]) == len(output.items)


@pytest.mark.parametrize("output", outputs())
def test_anthropic_results_pass_the_sdk_types(output: ToolOutput) -> None:
    block = output.to_anthropic("toolu_1")
    check_typed_dict(ToolResultBlockParam, block)
    check_typed_dict(MessageParam, {"role": "user", "content": [block]})
    assert block["is_error"] is not output.success
    assert all(part["type"] != "text" or part["text"] for part in block["content"])


def test_result_shapes() -> None:
    png_url = png_data_url()
    output = ToolOutput(
        items=[InputText(text="head"), InputImage(image_url=png_url), InputText(text="")],
        success=True,
        status="completed",
    )
    assert output.to_openai("c") == {
        "type": "custom_tool_call_output",
        "call_id": "c",
        "output": [
            {"type": "input_text", "text": "head"},
            {"type": "input_image", "image_url": png_url, "detail": "high"},
            {"type": "input_text", "text": ""},
        ],
    }
    assert output.to_anthropic("t") == {
        "type": "tool_result",
        "tool_use_id": "t",
        "content": [
            {"type": "text", "text": "head"},
            {
                "type": "image",
                "source": {
                    "type": "base64",
                    "media_type": "image/png",
                    "data": png_url.partition(",")[2],
                },
            },
        ],
        "is_error": False,
    }
    unchecked = ToolOutput(
        items=[InputImage(image_url="data:text/plain;base64,aGk=")], success=True, status="running"
    )
    assert unchecked.to_anthropic("t")["content"] == [
        {"type": "text", "text": "image content omitted because it could not be processed"}
    ]
