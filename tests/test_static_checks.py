"""The repository stays clean under ruff (lint and format) and mypy --strict."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.typecheck import ROOT


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)


@pytest.mark.parametrize(
    "command",
    [("ruff", "check", "."), ("ruff", "format", "--check", ".")],
    ids=["ruff-check", "ruff-format"],
)
def test_ruff(command: tuple[str, ...]) -> None:
    result = run(sys.executable, "-m", *command)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict() -> None:
    result = run(sys.executable, "-m", "tests.typecheck")
    assert result.returncode == 0, result.stdout + result.stderr


def test_no_third_party_engine_source_is_tracked() -> None:
    tracked = run("git", "ls-files").stdout.split()
    vendored = [p for p in tracked if p.rsplit("/", 1)[-1] in {"quickjs.c", "quickjs.h"}]
    assert vendored == []
