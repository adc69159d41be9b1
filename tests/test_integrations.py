"""What every framework integration shares: a missing extra is one line naming it, and nothing
imports a framework before its integration is imported."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from tests.typecheck import ROOT

INTEGRATIONS = [
    ("pydantic_ai", "pydantic_ai", "pydantic-ai", "pydantic-ai-slim>=2.68.0"),
    ("openai_agents", "agents", "openai-agents", "openai-agents>=0.24.0"),
]


@pytest.mark.parametrize(("name", "framework", "extra", "requirement"), INTEGRATIONS)
def test_a_missing_extra_is_one_line_naming_it(
    name: str, framework: str, extra: str, requirement: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = f"codemode.integrations.{name}"
    monkeypatch.setitem(sys.modules, framework, None)  # importing it now raises ImportError
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(ImportError) as raised:
        importlib.import_module(module)
    assert str(raised.value) == f"{module} needs {requirement}: pip install 'codemode[{extra}]'"


@pytest.mark.slow
def test_importing_codemode_and_the_bridge_loads_no_framework() -> None:
    frameworks = [framework for _, framework, _, _ in INTEGRATIONS]
    script = (
        "import sys, codemode, codemode.aio, codemode.integrations\n"
        f"print([m for m in {frameworks!r} if m in sys.modules])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout == "[]\n"
