"""Development sessions: tests, lint, typecheck, bench, mindeps, fuzz.

Each session installs the project with its dev extras into its own virtual environment.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import nox

nox.options.sessions = ["tests", "lint", "typecheck"]
nox.options.reuse_existing_virtualenvs = True


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite (engine, runtime, host); ruff and mypy are the lint and typecheck
    sessions'."""
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


# The peer of the engine benchmark: the quickjs-ng wheel of the version the engine is built from
# (setup.py QUICKJS_REQUIREMENT); installed here only, never a dependency of codemode.
QUICKJS_WHEEL = "quickjs-ng==0.17.0.2"


@nox.session
def bench(session: nox.Session) -> None:
    """The benchmark table of issue 10: every figure beside its floor, one table printed and
    written as JSON (`benchmarks/results/latest.json`). `nox -s bench -- --quick` cuts the
    repetitions; `-- --json PATH` writes elsewhere. `benchmarks/waiting_bench.py` (model turns,
    30 s of wall time) runs on its own."""
    session.install("-e", ".[dev]", QUICKJS_WHEEL)
    session.run("python", "-m", "benchmarks.table", *session.posargs)


@nox.session
def fuzz(session: nox.Session) -> None:
    """The wire fuzz tests with many more examples, and a fresh random seed each run (the
    suite runs a fixed sequence of 40-60). `nox -s fuzz -- -x` stops at the first failure."""
    session.install("-e", ".[dev]")
    session.run(
        "pytest",
        "-s",
        "tests/test_fuzz_host.py",
        "tests/test_fuzz_client.py",
        *session.posargs,
        env={"CODEMODE_FUZZ_EXAMPLES": session.env.get("CODEMODE_FUZZ_EXAMPLES", "500")},
    )


def _lower_bounds() -> list[str]:
    """The runtime dependencies of pyproject.toml, and those of its `mcp` extra (which the dev
    extra installs), pinned to their lower bounds."""
    project = tomllib.loads(Path("pyproject.toml").read_text())["project"]
    pins = []
    requirements = project["dependencies"] + project["optional-dependencies"]["mcp"]
    for requirement in requirements:
        name, _, bound = requirement.partition(">=")
        if not bound:
            raise ValueError(f"runtime dependency without a lower bound: {requirement}")
        pins.append(f"{name.strip()}=={bound.strip()}")
    return pins


@nox.session
def mindeps(session: nox.Session) -> None:
    """The suite with every runtime dependency at the lowest version pyproject.toml allows.

    Typing is not checked here: the type checker's verdict depends on the dependencies' own
    stubs (msgspec 0.18 types `Decoder.decode` as taking `bytes` only), and the pinned
    development environment (`nox -s typecheck`) is where typing is checked.
    """
    constraints = Path(session.create_tmp()) / "lower-bounds.txt"
    constraints.write_text("\n".join(_lower_bounds()) + "\n")
    session.install("-c", str(constraints), "-e", ".[dev]")
    session.run(
        "python", "-c", "import trio, msgspec; print(trio.__version__, msgspec.__version__)"
    )
    session.run("pytest", *session.posargs)
