"""Development sessions: tests, lint, typecheck, bench.

Each session installs the project with its dev extras into its own virtual environment.
"""

from __future__ import annotations

from pathlib import Path

import nox

nox.options.sessions = ["tests", "lint", "typecheck"]
nox.options.reuse_existing_virtualenvs = True


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite (engine, runtime, host), static checks included."""
    session.install("-e", ".[dev]")
    session.run("pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff's lint rules and formatting."""
    session.install("-e", ".[dev]")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict over the packages and the tests."""
    session.install("-e", ".[dev]")
    session.run("python", "-m", "tests.typecheck")


@nox.session
def bench(session: nox.Session) -> None:
    """Every benchmark script; each prints its figures beside a baseline of the same run."""
    session.install("-e", ".[dev]")
    for script in sorted(Path("benchmarks").glob("*_bench.py")):
        session.run("python", str(script))
