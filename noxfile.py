"""Development sessions: tests, lint, typecheck, sanitize, compiled, bench, mindeps, fuzz.

Where each session runs, and why:

- `lint` and `typecheck` run in the environment nox itself runs in (`venv_backend="none"`):
  the README's set-up makes `.venv` with the `dev` extra, whose pins are the ruff and mypy
  versions and the dependencies whose types mypy reads, so `.venv/bin/nox -s lint typecheck`
  checks with exactly those, and installs nothing. An environment of their own would install
  the `dev` extra a second time (Ray, the model SDKs, the MCP SDK) and compile the engine,
  which mypy's stubtest imports: the README's set-up over again, for the same versions. Run
  from an environment without ruff or mypy (a nox installed on its own), they stop and say so.
- `sanitize` has a virtual environment of its own (`.nox/sanitize`), because its engine is
  built with other flags and must never replace the developer's `-O3` build: it installs only
  what the engine tests import, builds the extension in its own folders and runs the tests
  against a copy of `host/` holding that build (the session's docstring says how).
- `compiled` runs where lint and typecheck do (it needs mypy and every test's dependency), in a
  copy of the repository: the modules mypyc compiles must never land in the source tree.
- `tests`, `bench`, `mindeps` and `fuzz` each install the project, editable, in an environment
  of their own (mindeps: at its lowest dependency versions; bench: beside the quickjs-ng
  wheel). Environments are reused between runs (`reuse_existing_virtualenvs`); `nox -R`
  skips their installs.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import nox

nox.options.sessions = ["tests", "lint", "typecheck"]
nox.options.reuse_existing_virtualenvs = True

PYPROJECT = tomllib.loads(Path("pyproject.toml").read_text())


def _pinned(*names: str) -> list[str]:
    """The `dev` extra's pins of these distributions (pyproject.toml)."""
    pins = {
        pin.partition("==")[0]: pin for pin in PYPROJECT["project"]["optional-dependencies"]["dev"]
    }
    return [pins[name] for name in names]


def _beside_nox(session: nox.Session, *modules: str) -> None:
    """Stop unless `modules` are installed in the environment nox runs in."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        session.error(
            f"{', '.join(missing)} not installed beside nox ({sys.executable}): run nox from the"
            " environment the README sets up, as `.venv/bin/nox`"
        )


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite (engine, runtime, host); ruff and mypy are the lint and typecheck
    sessions'."""
    session.install("-e", ".[dev]")
    session.run("pytest", *session.posargs)


@nox.session(venv_backend="none")
def lint(session: nox.Session) -> None:
    """ruff's lint rules and formatting, with the ruff nox runs beside."""
    _beside_nox(session, "ruff")
    session.run(sys.executable, "-m", "ruff", "check", ".")
    session.run(sys.executable, "-m", "ruff", "format", "--check", ".")


@nox.session(venv_backend="none")
def typecheck(session: nox.Session) -> None:
    """mypy --strict over the packages and the tests, then stubtest of the engine's stub against
    the built module (`tests/typecheck.py`), with the mypy nox runs beside."""
    _beside_nox(session, "mypy", "codemode_host")
    session.run(sys.executable, "-m", "tests.typecheck")


SANITIZED_TESTS = [
    *sorted(str(path) for path in Path("tests").glob("test_engine*.py")),
    *sorted(str(path) for path in Path("tests").glob("test_runtime*.py")),
    "tests/test_cell_globals.py",
    "tests/test_sandbox_surface.py",
    "tests/test_limits.py",
    "tests/test_pending_frontier.py",
    "tests/test_misbehaving_tools.py",
]
"""The tests that drive the engine's C code hardest: the binding itself, cells through both
providers (the host processes load the sanitized build too), the sandbox's surface, every
limit (heap, stack, CPU, output, a hundred thousand tool calls), paused cells and their timers,
and tools that answer badly. Four to six minutes on two busy cores."""


def _sanitizer_runtime() -> str:
    """The path of gcc's AddressSanitizer runtime, which must be loaded before anything else."""
    path = subprocess.run(
        ["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True, check=True
    ).stdout.strip()
    if not os.path.isabs(path):  # gcc echoes the bare name of a library it does not have
        raise RuntimeError("gcc has no AddressSanitizer runtime (libasan.so)")
    return path


@nox.session
def sanitize(session: nox.Session) -> None:
    """The engine tests against an extension built with AddressSanitizer and
    UndefinedBehaviorSanitizer (`CODEMODE_SANITIZE=1`, setup.py: `-O1 -g`, every UBSan finding
    fatal). `nox -s sanitize -- tests/test_engine.py -x` runs other tests instead.

    The extension is built in this environment's own folders (`.nox/sanitize/engine-build`,
    kept between runs: it is rebuilt only when a source or a flag changed), next to a copy of
    `host/` (`.nox/sanitize/sanitized/codemode_host`) that holds it; `PYTHONPATH` puts that
    copy, then the repository (for `codemode` and `tests`), first for pytest and for the hosts
    it spawns, which inherit the environment. The built file must reference `__asan_init` and
    UBSan's handlers, and the tests' interpreter must import that very file, or the session
    fails before any test.

    Python is not built with the sanitizers, so their runtime is preloaded (`LD_PRELOAD`) in
    every process. `detect_leaks=0`: at exit LeakSanitizer would report every allocation
    CPython never frees (interned objects, its arenas, module state), thousands of reports
    that would drown any of ours; the debug build's `JS_FreeRuntime` assertions catch values
    the binding leaks (docs/engine.md, "Checking the binding").
    """
    build_requires = PYPROJECT["build-system"]["requires"]  # setup.py fetches with pip
    # pytest-xdist: pyproject.toml's addopts name its `--dist` option (a no-op without `-n`).
    test_requires = _pinned("pytest", "pytest-trio", "pytest-xdist", "hypothesis")
    # anyio: tests/test_misbehaving_tools.py calls anyio from a tool (the mcp SDK's runtime).
    session.install(*build_requires, *PYPROJECT["project"]["dependencies"], *test_requires, "anyio")

    location = Path(session.virtualenv.location)
    build = location / "engine-build"
    session.run(
        "python", "setup.py", "--quiet", "build_ext",
        "--build-lib", str(build / "lib"), "--build-temp", str(build / "temp"),
        env={"CODEMODE_SANITIZE": "1"},
    )  # fmt: skip
    (built,) = (build / "lib" / "codemode_host").glob("_quickjs.*.so")
    symbols = session.run(
        "nm", "--dynamic", "--undefined-only", str(built), external=True, silent=True
    )
    assert isinstance(symbols, str)
    if "__asan_init" not in symbols or "__ubsan_handle_" not in symbols:
        session.error(f"{built} is not built with AddressSanitizer and UBSan")

    tree = location / "sanitized"
    shutil.rmtree(tree, ignore_errors=True)
    package = tree / "codemode_host"
    shutil.copytree("host", package, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    shutil.copy2(built, package / built.name)

    preload = " ".join(filter(None, [_sanitizer_runtime(), os.environ.get("LD_PRELOAD")]))
    env = {
        "LD_PRELOAD": preload,
        "ASAN_OPTIONS": "detect_leaks=0",
        "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
        "PYTHONPATH": os.pathsep.join([str(tree), str(Path.cwd())]),
    }
    session.run(
        "python", "-c",
        "import sys, codemode_host._quickjs as m; assert m.__file__ == sys.argv[1], m.__file__",
        str(package / built.name), env=env,
    )  # fmt: skip
    session.run("pytest", "-p", "no:cacheprovider", *(session.posargs or SANITIZED_TESTS), env=env)


# What `compiled` keeps in its copy of the repository between runs, beside the repository's files.
COPY_OWN = {"build", ".mypy_cache", ".venv"}


def _check_wheel_extensions(session: nox.Session, wheel: Path, tree: Path) -> None:
    """Stop unless the wheel's extension modules are exactly the engine, mypyc's shared
    library and one per module of setup.py's `COMPILED_MODULES`: a module left from an earlier
    build of the reused build folder would be imported instead of its source."""
    (listed,) = [
        ast.literal_eval(node.value)
        for node in ast.parse((tree / "setup.py").read_text()).body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id == "COMPILED_MODULES"
    ]
    expected = {"codemode_host._quickjs", "codemode__mypyc"} | {
        path.removesuffix(".py").replace("host/", "codemode_host/", 1).replace("/", ".")
        for path in listed
    }
    with zipfile.ZipFile(wheel) as archive:
        found = {
            name.partition(".")[0].replace("/", ".")
            for name in archive.namelist()
            if name.endswith(".so")
        }
    if found != expected:
        session.error(
            f"{wheel.name}: extension modules {sorted(found - expected)} not built from"
            f" COMPILED_MODULES, and {sorted(expected - found)} missing"
        )


@nox.session(venv_backend="none")
def compiled(session: nox.Session) -> None:
    """The whole suite against the modules mypyc compiles (`CODEMODE_COMPILE=1`, setup.py;
    docs/compiled.md). `nox -s compiled -- tests/test_protocol_states.py -x` runs other tests.

    In the environment nox runs in, like lint and typecheck (the README's set-up has mypy and
    every test's dependency). The compiled modules must never land in the source tree, where
    they would shadow the sources a developer edits; so the repository's files are copied to
    `.nox/compiled/tree`, a wheel is built from the copy with `CODEMODE_COMPILE=1` as a user
    would build one, its compiled modules are put beside their sources in the copy, and the
    tests run from it: its `codemode`, and a copy of its `host/` named `codemode_host` with the
    wheel's compiled host modules, come first on the path, for pytest and for the hosts the
    tests spawn. The session fails before any test unless the compiled modules are the ones
    imported.
    """
    _beside_nox(session, "mypy", "pytest", "codemode_host")
    tree = Path(".nox", "compiled", "tree").resolve()
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    listed = set(filter(None, files))
    for root, directories, names in os.walk(tree):
        # A file the repository no longer has goes (a removed test would still run), but not
        # the copy's own: its build and mypy's cache, the `.venv` link below, bytecode.
        directories[:] = [
            name
            for name in directories
            if name != "__pycache__" and (root != str(tree) or name not in COPY_OWN)
        ]
        for name in names:
            path = Path(root, name)
            if str(path.relative_to(tree)) not in listed:
                path.unlink()
    for name in listed:
        source, target = Path(name), tree / name
        if source.is_file() and (
            not target.is_file() or target.read_bytes() != source.read_bytes()
        ):
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    engine_sources = Path("build", "quickjs-ng-0.17.0.2")
    if engine_sources.is_dir() and not (tree / engine_sources).is_dir():
        shutil.copytree(engine_sources, tree / engine_sources)  # not fetched a second time
    # A wheel, as a user builds it (build_backend.py asks for mypyc's needs); its compiled
    # modules are put beside their sources in the copy.
    wheels = tree.parent / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    session.run(
        sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(wheels),
        str(tree), env={"CODEMODE_COMPILE": "1"},
    )  # fmt: skip
    (wheel,) = wheels.glob("codemode-*.whl")
    _check_wheel_extensions(session, wheel, tree)
    for stale in [*tree.glob("*.so"), *(tree / "codemode").rglob("*.so")]:
        stale.unlink()  # a module no longer compiled must not stay compiled
    # `host/` is imported as `codemode_host`: a copy of it by that name, first on the path.
    hosts = tree.parent / "host-path"
    shutil.rmtree(hosts, ignore_errors=True)
    shutil.copytree(tree / "host", hosts / "codemode_host")
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.endswith(".so"):
                target = hosts / name if name.startswith("codemode_host/") else tree / name
                target.write_bytes(archive.read(name))
    env = {"PYTHONPATH": os.pathsep.join([str(hosts), str(tree)])}
    venv = tree / ".venv"  # the README's commands, which tests run, name `.venv/bin/...`
    if not venv.is_symlink():
        venv.symlink_to(Path(sys.prefix), target_is_directory=True)
    with session.chdir(tree):
        session.run(
            sys.executable, "-c",
            "import codemode.protocol._endpoint as c, codemode_host.server as h;"
            " assert c.__file__.endswith('.so') and h.__file__.endswith('.so'), (c, h)",
            env=env,
        )  # fmt: skip
        session.run(
            sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2",
            *session.posargs, env=env,
        )  # fmt: skip


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


# The extras whose lower bounds `mindeps` installs (the dev extra installs each of them).
MINDEPS_EXTRAS = ("mcp", "pydantic-ai", "openai-agents")


def _lower_bounds() -> list[str]:
    """The runtime dependencies of pyproject.toml, and those of the extras in `MINDEPS_EXTRAS`,
    pinned to their lower bounds."""
    project = PYPROJECT["project"]
    pins = []
    requirements = list(project["dependencies"])
    for extra in MINDEPS_EXTRAS:
        requirements += project["optional-dependencies"][extra]
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
