"""`codemode-host`'s command line (its `--help`, bad options) and the Linux-only rule: the
providers and the host refuse another system with one clear error."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import trio
from codemode_host._options import parse_options

import codemode
from codemode import Completed, UnsupportedPlatformError
from tests.delegates import RecordingDelegate
from tests.sessions import run, texts

HOST = [sys.executable, "-m", "codemode_host"]
ROOT = Path(__file__).resolve().parent.parent


def _host(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*HOST, *arguments],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.mark.slow
def test_help_describes_the_program_and_its_options() -> None:
    done = _host("--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: codemode-host")
    for phrase in ("QuickJS-ng", "stdin and stdout", "--log-level", "--workers", "--max-workers",
                   "--version", "CODEMODE_HOST_LOG"):  # fmt: skip
        assert phrase in done.stdout, phrase
    print(done.stdout)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("arguments", "reason"),
    [
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["positional"], "unrecognized arguments: positional"),
        (["--workers", "0"], "argument --workers: expected a positive integer, got '0'"),
        (["--workers", "x"], "argument --workers: expected a positive integer, got 'x'"),
        (["--max-workers"], "argument --max-workers: expected one argument"),
        (["--max-workers", "1025"], "argument --max-workers: expected at most 1024 workers"),
        (["--log-level", "loud"], "argument --log-level: expected one of DEBUG, INFO, WARNING,"),
    ],
)
def test_a_bad_option_is_one_line_and_status_2(arguments: list[str], reason: str) -> None:
    done = _host(*arguments)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"codemode-host: error: {reason}")
    assert lines[0].endswith("(see codemode-host --help)")


@pytest.mark.slow
async def test_the_host_serves_with_its_options() -> None:
    command = [*HOST, "--workers", "1", "--max-workers", "2", "--log-level", "error"]
    with trio.fail_after(30):
        async with codemode.open_process_provider(command) as provider:
            session = await provider.create_session()
            response = await run(session, RecordingDelegate(), "text(6 * 7)")
            assert isinstance(response, Completed)
            assert texts(response) == ["42"]


@pytest.mark.slow
async def test_an_active_cell_cap_past_the_engine_worker_bound_still_serves() -> None:
    # The worker ceiling follows the active-cell cap; past the engine's 1,024 workers it used
    # to crash the host at start with a traceback.
    command = [*HOST, "--max-active-cells", "5000"]
    with trio.fail_after(30):
        async with codemode.open_process_provider(command) as provider:
            session = await provider.create_session()
            response = await run(session, RecordingDelegate(), "text(6 * 7)")
            assert texts(response) == ["42"]


@pytest.mark.slow
def test_version_prints_the_installed_version() -> None:
    from importlib.metadata import version

    done = _host("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"codemode-host {version('codemode')}\n"


# What the host's start must not load (each costs its cold start; docs/benchmarks.md, item 8):
# the client's layers, and `importlib.metadata`, which only `--version` needs.
NOT_LOADED_AT_START = (
    "codemode.model",
    "codemode.mcp",
    "codemode.cli",
    "codemode.process",
    "codemode.remote",
    "codemode._wire",
    "codemode.inprocess",
    "codemode._toolbox",
    "importlib.metadata",
)


@pytest.mark.slow
def test_the_host_start_loads_nothing_it_does_not_need() -> None:
    code = (
        "import sys\n"
        "from codemode_host.__main__ import parse_options\n"
        "parse_options([])\n"
        f"print(sorted(n for n in sys.modules if n.startswith({NOT_LOADED_AT_START!r})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True
    )
    assert done.stdout.strip() == "[]"


def test_the_options_parse() -> None:
    options = parse_options(["--workers", "3", "--log-level", "debug"])
    assert (options.workers, options.max_workers, options.log_level) == (3, None, "DEBUG")


# ---- Linux only --------------------------------------------------------------------------


def test_the_project_says_it_is_linux_only() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "Operating System :: POSIX :: Linux" in project["classifiers"]
    assert "Linux only" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("platform", ["darwin", "win32", "freebsd14"])
async def test_providers_refuse_another_system(
    monkeypatch: pytest.MonkeyPatch, platform: str
) -> None:
    monkeypatch.setattr(sys, "platform", platform)
    expected = (
        "codemode runs only on Linux (it needs eventfd, pidfd and F_SETPIPE_SZ);"
        f" this system is '{platform}'"
    )
    with trio.fail_after(10):
        with pytest.raises(UnsupportedPlatformError) as raised:
            async with codemode.open_process_provider():
                pytest.fail("the process provider opened")  # pragma: no cover
        assert str(raised.value) == expected
        with pytest.raises(UnsupportedPlatformError) as raised:
            async with codemode.open_in_process_provider():
                pytest.fail("the in-process provider opened")  # pragma: no cover
        assert str(raised.value) == expected
    assert isinstance(raised.value, codemode.CodeModeError)


def test_the_host_refuses_another_system(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    with pytest.raises(SystemExit) as exited:
        parse_options([])
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        "codemode-host: error: codemode runs only on Linux (it needs eventfd, pidfd and"
        " F_SETPIPE_SZ); this system is 'darwin'\n"
    )
