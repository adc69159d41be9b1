"""Cheap checks of the repository itself, run with the suite.

ruff and mypy are not run here: `nox -s lint typecheck` runs them (README, "Run the checks"),
so that the suite's time goes to the code's behaviour and a formatting slip does not fail a
test run.
"""

from __future__ import annotations

import subprocess

from tests.typecheck import ROOT


def test_no_third_party_engine_source_is_tracked() -> None:
    # The QuickJS-ng sources come from the pinned source distribution at build time (setup.py).
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    vendored = [p for p in tracked if p.rsplit("/", 1)[-1] in {"quickjs.c", "quickjs.h"}]
    assert vendored == []
