"""The public surface of `codemode` is exactly design.md, design 4's names (so far)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import codemode


def test_all_is_complete() -> None:
    public = {name for name in dir(codemode) if not name.startswith("_")}
    public.discard("annotations")
    assert len(set(codemode.__all__)) == len(codemode.__all__)  # ruff (RUF022) keeps it sorted
    # Every exported name resolves (the in-process provider is imported on first use).
    for name in codemode.__all__:
        assert getattr(codemode, name) is not None
    modules = {
        "inprocess",
        "errors",
        "model",
        "process",
        "protocol",
        "mcp",
        "ray",
        "remote",
        "aio",
        "integrations",
        "observability",
    }
    assert public - modules - {"TYPE_CHECKING"} <= set(codemode.__all__)


def test_design_names_are_exported() -> None:
    design = {
        "CellId", "ToolKind", "ToolName", "ToolDefinition", "ExecuteRequest", "WaitRequest",
        "InputText", "InputImage", "ImageDetail", "RuntimeResponse", "Yielded", "Completed",
        "Terminated", "WaitOutcome", "LiveCell", "MissingCell", "NestedToolCall", "CellLimits",
        "SessionDelegate", "Session", "StartedCell", "open_in_process_provider", "CodeModeError",
        "ToolError", "normalize_identifier", "HostLostError", "ProviderClosedError", "Toolbox",
        "combine", "CodeMode", "ToolOutput", "ExecSource", "parse_exec_source", "PragmaError",
        "truncate_middle", "truncate_items", "render_typescript", "NamespaceDescription",
    }  # fmt: skip
    assert design <= set(codemode.__all__)


def test_value_types_are_frozen_and_keyword_only() -> None:
    text = codemode.InputText(text="x")
    try:
        text.text = "y"  # type: ignore[misc]
    except AttributeError:
        pass
    else:  # pragma: no cover
        raise AssertionError("InputText is not frozen")
    assert codemode.ToolName.plain("a") == codemode.ToolName(name="a")
    assert codemode.ToolName.namespaced("ns", "a") == codemode.ToolName(name="a", namespace="ns")
    assert codemode.WaitRequest(cell_id="1").yield_time_ms == 10_000
    assert codemode.ExecuteRequest(tool_call_id="c", source="1").enabled_tools == []


def test_normalize_identifier() -> None:
    assert codemode.normalize_identifier("hidden-dynamic-tool") == "hidden_dynamic_tool"
    assert codemode.normalize_identifier("mcp__ologs__get_profile") == "mcp__ologs__get_profile"
    assert codemode.normalize_identifier("9lives") == "_lives"
    assert codemode.normalize_identifier("") == "_"
    assert codemode.normalize_identifier("a.b c$") == "a_b_c$"
    assert codemode.normalize_identifier("é") == "_"


@pytest.mark.slow
def test_model_layer_loads_trio_only_for_code_mode() -> None:
    # `import codemode` is also how the host reaches the sans-IO protocol package.
    code = (
        "import sys, codemode; before = 'trio' in sys.modules; codemode.CodeMode; "
        "print(before, 'trio' in sys.modules, 'codemode_host' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.split() == ["False", "True", "False"]
    assert issubclass(codemode.PragmaError, codemode.CodeModeError)


def test_mcp_package_exports() -> None:
    import codemode.mcp

    public = {name for name in dir(codemode.mcp) if not name.startswith("_")}
    assert sorted(codemode.mcp.__all__) == codemode.mcp.__all__
    assert set(codemode.mcp.__all__) == public - {"annotations"}
    assert "open_mcp_toolbox" in codemode.mcp.__all__
