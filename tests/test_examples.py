"""The examples in the README run as documented."""

from __future__ import annotations

import subprocess
import sys

from tests.typecheck import ROOT


def test_quickstart_runs() -> None:
    result = subprocess.run(
        [sys.executable, "examples/quickstart.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "Completed [InputText(text='warmest: Lima at 19 C')]" in result.stdout
    assert "[notification from cell 1] all cities checked" in result.stdout
    assert "[cell 1 closed]" in result.stdout
