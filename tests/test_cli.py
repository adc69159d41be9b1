"""The `codemode` command end to end: the installed console script in a subprocess.

Outputs are compared exactly, the wall-time figure aside. Runs that must be stopped synchronise
on what the command printed (its first response, or a notification), never on a sleep.
"""

from __future__ import annotations

import base64
import io
import json
import os
import pty
import re
import signal
import subprocess
import sys
from pathlib import Path

import PIL.Image
import pytest
import trio

from codemode.model import ModelApi, exec_description, tool_specs
from examples.weather_tools import toolbox
from tests.typecheck import ROOT

pytestmark = pytest.mark.slow  # Every test runs the `codemode` command (a subprocess).

COMMAND = str(Path(sys.executable).parent / "codemode")
WEATHER_TOOLS = ("--tools", "examples.weather_tools:toolbox")
TIMEOUT = 60


def normalised(text: str) -> str:
    return re.sub(r"Wall time \d+\.\d seconds", "Wall time N seconds", text)


async def codemode(
    *arguments: str, cwd: Path = ROOT, stderr: int | None = None
) -> subprocess.CompletedProcess[bytes]:
    """Run the command; its stderr is captured unless `stderr` names a file descriptor."""
    capture = {"capture_stderr": True} if stderr is None else {"stderr": stderr}
    with trio.fail_after(TIMEOUT):
        return await trio.run_process(
            [COMMAND, *arguments], cwd=cwd, capture_stdout=True, check=False, **capture
        )


def header(status: str) -> str:
    return f"{status}\nWall time N seconds\nOutput:\n"


# ---- run: the examples -----------------------------------------------------------------------

WEATHER_OUTPUT = header("Script completed") + (
    "Lima: 19 celsius\n"
    "Paris: 11 celsius\n"
    "Oslo: -2 celsius\n"
    'Lima forecast: [{"day":1,"low":16,"high":23,"sky":"cloudy"},'
    '{"day":2,"low":17,"high":24,"sky":"rain"}]\n'
)

WATCH_OUTPUT = (
    header("Script running with cell ID 1")
    + "day 1: -5 to 2 C, cloudy\n\n"
    + header("Script running with cell ID 1")
    + "day 2: -4 to 3 C, rain\n\n"
    + header("Script completed")
    + "day 3: -3 to 4 C, snow\nwatch over\n"
)

FAIL_OUTPUT = header("Script failed") + (
    "caught: unknown city: Atlantis (try one of Lima, Oslo, Paris)\n"
    "caught: invalid arguments for tool forecast: Expected `int` <= 7 - at `$.days`\n"
    "Script error:\n"
    "invalid arguments for tool current_temperature: Object contains unknown field `town`\n"
)


@pytest.mark.parametrize(
    ("script", "status", "expected"),
    [
        ("examples/weather.js", 0, WEATHER_OUTPUT),
        ("examples/weather_watch.js", 0, WATCH_OUTPUT),
        ("examples/weather_fail.js", 1, FAIL_OUTPUT),
    ],
    ids=["completes", "yields", "fails"],
)
@pytest.mark.parametrize("where", [[], ["--in-process"]], ids=["host", "in-process"])
async def test_run_prints_what_the_model_sees(
    script: str, status: int, expected: str, where: list[str]
) -> None:
    result = await codemode("run", script, *WEATHER_TOOLS, *where)
    assert (result.returncode, result.stderr) == (status, b"")
    assert normalised(result.stdout.decode()) == expected


async def test_run_options_go_into_the_pragma_and_the_waits(tmp_path: Path) -> None:
    script = tmp_path / "long.js"
    # The file's own pragma is overridden by the options (design.md, runtime 7.5, N=5).
    script.write_text('// @exec: {"max_output_tokens": 1000}\ntext("0123456789".repeat(4));\n')
    result = await codemode("run", str(script), "--max-tokens", "5")
    assert result.returncode == 0
    assert normalised(result.stdout.decode()) == header("Script completed") + (
        "Warning: truncated output (original token count: 10)\nTotal output lines: 1\n\n"
        "0123456789…5 tokens truncated…0123456789\n"
    )

    script.write_text(
        'text("a"); await new Promise((resolve) => setTimeout(resolve, 100)); text("b");\n'
    )
    result = await codemode("run", str(script), "--yield-time-ms", "0", "--in-process")
    assert result.returncode == 0
    responses = re.split(r"(?<=\n)\n(?=Script )", normalised(result.stdout.decode()))
    # A 0 ms window yields at once, before the cell's first output; every wait yields at once
    # too, so the output arrives over several responses, however the timer falls.
    assert responses[0] == header("Script running with cell ID 1")
    assert responses[-1].startswith(header("Script completed"))
    outputs = [line for response in responses for line in response.splitlines()[3:]]
    assert outputs == ["a", "b"]


async def test_run_without_tools_and_with_an_image(tmp_path: Path) -> None:
    image = io.BytesIO()
    PIL.Image.new("RGB", (3, 2), "teal").save(image, "PNG")
    png = image.getvalue()
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    script = tmp_path / "image.js"
    script.write_text(f'text(typeof tools.list_cities); image("{url}"); text("after");\n')
    result = await codemode("run", str(script))
    assert (result.returncode, result.stderr) == (0, b"")
    assert normalised(result.stdout.decode()) == header("Script completed") + (
        f"undefined\n[image image/png, {len(png)} bytes]\nafter\n"
    )


CLOCK_TOOLS = """
import codemode
toolbox = codemode.Toolbox()

@toolbox.tool
def today() -> str:
    \"\"\"Today's date.\"\"\"
    return "2030-01-01"

@toolbox.tool
def broken() -> str:
    \"\"\"Always fails.\"\"\"
    raise ZeroDivisionError("no clock")
"""


async def test_several_toolboxes_and_a_failing_tool(tmp_path: Path) -> None:
    (tmp_path / "clock_tools.py").write_text(CLOCK_TOOLS)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    (tmp_path / "both.js").write_text(
        "text(await tools.today());\n"
        'text((await tools.current_temperature({ city: "Oslo" })).degrees);\n'
        "try { await tools.broken(); } catch (e) { text(e); }\n"
        'notify("done");\n'
    )
    arguments = ["run", "both.js", *WEATHER_TOOLS, "--tools", "clock_tools:toolbox"]
    result = await codemode(*arguments, cwd=tmp_path)
    assert result.returncode == 0
    assert normalised(result.stdout.decode()) == header("Script completed") + (
        "2030-01-01\n-2\ntool broken failed: no clock\n"
    )
    # The failure is logged with its traceback; the notification is shown.
    stderr = result.stderr.decode()
    assert stderr.startswith("codemode: codemode.toolbox: tool broken failed (cell 1)\n")
    assert 'raise ZeroDivisionError("no clock")' in stderr
    assert stderr.endswith("ZeroDivisionError: no clock\ncodemode: notify: done\n")


# ---- run: stopping a cell --------------------------------------------------------------------

SPIN_AFTER_YIELD = 'text("first"); yield_control(); while (true) {}\n'
SPIN_IN_EXEC = 'text("partial"); notify("spinning"); while (true) {}\n'


async def run_until_then_signal(
    script: Path, where: list[str], marker: bytes, signum: int, *, on_stderr: bool = False
) -> tuple[int, str, str]:
    """Start `codemode run`, wait until `marker` shows on its stdout (or stderr), send `signum`,
    and return the exit status, stdout and stderr."""
    with trio.fail_after(TIMEOUT):
        process = await trio.lowlevel.open_process(
            [COMMAND, "run", str(script), *where],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert process.stdout is not None
        assert process.stderr is not None
        captured = {"stdout": b"", "stderr": b""}
        seen = trio.Event()

        async def collect(name: str, stream: trio.abc.ReceiveStream, watch: bool) -> None:
            async for chunk in stream:
                captured[name] += chunk
                if watch and marker in captured[name]:
                    seen.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(collect, "stdout", process.stdout, not on_stderr)
            nursery.start_soon(collect, "stderr", process.stderr, on_stderr)
            await seen.wait()
            process.send_signal(signum)
            status = await process.wait()
    return status, captured["stdout"].decode(), captured["stderr"].decode()


@pytest.mark.parametrize("where", [[], ["--in-process"]], ids=["host", "in-process"])
async def test_ctrl_c_terminates_the_cell_and_exits_130(tmp_path: Path, where: list[str]) -> None:
    script = tmp_path / "spin.js"
    script.write_text(SPIN_AFTER_YIELD)
    status, stdout, stderr = await run_until_then_signal(script, where, b"first\n", signal.SIGINT)
    assert (status, stderr) == (130, "")
    assert normalised(stdout) == (
        header("Script running with cell ID 1") + "first\n\n" + header("Script terminated")
    )


async def test_ctrl_c_during_exec_terminates_the_cell_it_started(tmp_path: Path) -> None:
    script = tmp_path / "spin.js"
    script.write_text(SPIN_IN_EXEC)
    status, stdout, stderr = await run_until_then_signal(
        script, [], b"spinning", signal.SIGINT, on_stderr=True
    )
    assert (status, stderr) == (130, "codemode: notify: spinning\n")
    assert normalised(stdout) == header("Script terminated") + "partial\n"


async def test_sigterm_terminates_the_cell_and_exits_3(tmp_path: Path) -> None:
    script = tmp_path / "spin.js"
    script.write_text(SPIN_AFTER_YIELD)
    status, stdout, _ = await run_until_then_signal(script, [], b"first\n", signal.SIGTERM)
    assert status == 3
    assert normalised(stdout).endswith("first\n\n" + header("Script terminated"))


async def test_progress_shows_on_a_terminal_only() -> None:
    controller, terminal = pty.openpty()
    try:
        result = await codemode("run", "examples/weather_watch.js", *WEATHER_TOOLS, stderr=terminal)
        os.close(terminal)
        shown = b""
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: the terminal's other side is closed and drained
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(controller)
    assert result.returncode == 0
    assert normalised(result.stdout.decode()) == WATCH_OUTPUT
    # The line is drawn at once, then refreshed while the cell runs, and cleared at the end.
    # (On a pipe, stderr stays empty: see the tests above.)
    assert re.match(
        rb"\r\x1b\[Kcodemode: running for \d+\.\d s; responses: 0, output items: 0", shown
    )
    lines = re.findall(
        rb"codemode: running for \d+\.\d s; responses: (\d), output items: (\d)", shown
    )
    assert lines == sorted(lines)
    assert set(lines) <= {(b"0", b"0"), (b"1", b"1"), (b"2", b"2")}
    assert shown.endswith(b"\r\x1b[K")


# ---- run: odd input, closed output, tools that misbehave ---------------------------------------


async def test_a_byte_order_mark_does_not_hide_the_pragma(tmp_path: Path) -> None:
    script = tmp_path / "bom.js"
    script.write_bytes(
        b'\xef\xbb\xbf// @exec: {"max_output_tokens": 5}\ntext("0123456789".repeat(4));\n'
    )
    result = await codemode("run", str(script))
    assert (result.returncode, result.stderr) == (0, b"")
    assert "…5 tokens truncated…" in result.stdout.decode()


async def test_a_zero_yield_time_does_not_busy_loop(tmp_path: Path) -> None:
    script = tmp_path / "quiet.js"
    script.write_text('await new Promise((resolve) => setTimeout(resolve, 1000)); text("done");\n')
    result = await codemode("run", str(script), "--yield-time-ms", "0")
    assert (result.returncode, result.stderr) == (0, b"")
    # The exec's response at once, then waits that keep watching a silent cell for 1 s each
    # (thousands of responses before).
    headers = re.findall(r"^Script .*$", result.stdout.decode(), re.MULTILINE)
    assert 2 <= len(headers) <= 4, headers
    assert headers[-1] == "Script completed"
    assert result.stdout.decode().endswith("Output:\ndone\n")


async def test_a_pragma_out_of_range_prints_no_traceback(tmp_path: Path) -> None:
    script = tmp_path / "big_budget.js"
    script.write_text('// @exec: {"max_output_tokens": 3000000000}\ntext("hi");\n')
    result = await codemode("run", str(script))
    assert result.returncode == 1
    assert b"Traceback" not in result.stderr
    # The model's error output on stdout, or one line of codemode's on stderr.
    assert b"max_output_tokens" in result.stdout + result.stderr
    assert len(result.stderr.splitlines()) <= 1


@pytest.mark.slow
async def test_closed_standard_output_exits_141_quietly(tmp_path: Path) -> None:
    script = tmp_path / "big.js"
    script.write_text('for (let i = 0; i < 200000; i++) text("line " + i);\n')
    with trio.fail_after(TIMEOUT):
        process = await trio.lowlevel.open_process(
            [COMMAND, "run", str(script), "--max-tokens", "100000000"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert process.stdout is not None
        assert process.stderr is not None
        first = b""
        while b"\n" not in first:
            first += await process.stdout.receive_some()
        await process.stdout.aclose()  # as `| head -1` does once it has its line
        stderr = b""
        async for chunk in process.stderr:
            stderr += chunk
        status = await process.wait()
    assert first.startswith(b"Script completed\n")
    assert (status, stderr) == (141, b"")


@pytest.mark.slow
async def test_ctrl_c_while_python_imports_exits_130(tmp_path: Path) -> None:
    (tmp_path / "spin.js").write_text("while (true) {}\n")
    # Python reports each import as it ends: the signal lands while `codemode` is imported.
    environment = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    stderr = b""
    running = False
    try:
        with trio.fail_after(TIMEOUT):
            process = await trio.lowlevel.open_process(
                [COMMAND, "run", "spin.js"],
                cwd=tmp_path,
                env=environment,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            assert process.stderr is not None
            try:
                async for chunk in process.stderr:
                    stderr += chunk
                    if b" codemode.errors\n" in stderr:
                        break
                process.send_signal(signal.SIGINT)
                async for chunk in process.stderr:
                    stderr += chunk
                status = await process.wait()
            finally:
                # A hang must fail this test only: a child left running fails the tests that
                # count the suite's subprocesses.
                running = process.returncode is None
                if running:
                    process.kill()
                    with trio.CancelScope(shield=True):
                        await process.wait()
    except trio.TooSlowError:
        # What the command said (its import timings left out) is what tells where it hung.
        said = [line for line in stderr.splitlines() if not line.startswith(b"import time:")]
        pytest.fail(
            f"no end of the command's stderr {TIMEOUT} s after its Ctrl-C (the command"
            f" {'was still running' if running else 'had exited'}); it said: {said[-40:]!r}"
        )
    assert status == 130
    assert b"Traceback" not in stderr
    assert b"KeyboardInterrupt" not in stderr


DROPPING_TOOLS = """
import os, signal, weakref
import codemode

class _Token:
    pass

def _interrupt(reference):
    # Python runs SIGINT's handler inside this callback, and drops what the callback raises, as
    # it does in the import system's own weakref callback that ends every import.
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(100):
        pass

_token = _Token()
_reference = weakref.ref(_token, _interrupt)
del _token
toolbox = codemode.Toolbox()
"""


@pytest.mark.slow
@pytest.mark.parametrize("command", [["run", "spin.js"], ["describe"]], ids=["run", "describe"])
async def test_a_ctrl_c_python_drops_while_tools_are_imported_exits_130(
    tmp_path: Path, command: list[str]
) -> None:
    (tmp_path / "spin.js").write_text("while (true) {}\n")
    (tmp_path / "dropping_tools.py").write_text(DROPPING_TOOLS)
    result = await codemode(*command, "--tools", "dropping_tools:toolbox", cwd=tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (130, b"", b"")


UNCANCELLABLE_TOOLS = """
import sys, time
import codemode, trio

toolbox = codemode.Toolbox()

@toolbox.tool
async def fetch() -> str:
    \"\"\"Wraps a blocking call the usual way, which cancellation cannot stop.\"\"\"
    await trio.to_thread.run_sync(time.sleep, 30)
    return "fetched"

@toolbox.tool
def exits() -> str:
    \"\"\"Calls sys.exit, as argparse does on bad input.\"\"\"
    raise SystemExit(2)
"""


async def kill(process: trio.Process) -> None:
    process.kill()


UNCANCELLABLE_CELL = 'text("start"); yield_control(); await tools.fetch();\n'


STOPPED_IN_FETCH = (
    "Tool calls before the cell stopped: tools.fetch (call 1) was running and may have taken"
    " effect.\n"
)
"""The journal line of a cell terminated while its `fetch` call ran (docs/governance.md)."""


async def start_uncancellable(tmp_path: Path, *flags: str) -> tuple[trio.Process, dict[str, bytes]]:
    (tmp_path / "slow_tools.py").write_text(UNCANCELLABLE_TOOLS)
    (tmp_path / "cell.js").write_text(UNCANCELLABLE_CELL)
    process = await trio.lowlevel.open_process(
        [COMMAND, "run", "cell.js", "--tools", "slow_tools:toolbox", *flags],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    return process, {"stdout": b"", "stderr": b""}


async def collect_until(
    stream: trio.abc.ReceiveStream, captured: dict[str, bytes], name: str, marker: bytes
) -> None:
    while marker not in captured[name]:
        chunk = await stream.receive_some()
        assert chunk, captured
        captured[name] += chunk


async def collect_to_end(
    stream: trio.abc.ReceiveStream, captured: dict[str, bytes], name: str
) -> None:
    async for chunk in stream:
        captured[name] += chunk


async def exit_status(process: trio.Process, captured: dict[str, bytes]) -> int:
    """The process's exit status, once both its streams are read to their end."""
    assert process.stdout is not None
    assert process.stderr is not None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(collect_to_end, process.stdout, captured, "stdout")
        nursery.start_soon(collect_to_end, process.stderr, captured, "stderr")
        return await process.wait()


@pytest.mark.slow
@pytest.mark.parametrize("flags", [(), ("--in-process",)], ids=["process", "in-process"])
async def test_ctrl_c_ends_the_run_in_bounded_time_despite_a_stuck_tool(
    tmp_path: Path, flags: tuple[str, ...]
) -> None:
    with trio.fail_after(TIMEOUT):
        process, captured = await start_uncancellable(tmp_path, *flags)
        assert process.stdout is not None
        assert process.stderr is not None
        await collect_until(process.stdout, captured, "stdout", b"start\n")
        process.send_signal(signal.SIGINT)
        interrupted_at = trio.current_time()
        status = await exit_status(process, captured)
        elapsed = trio.current_time() - interrupted_at
    assert status == 130
    # EXIT_TIMEOUT (5 s) after the signal at the latest, the tool's thread still asleep.
    assert elapsed < 8, elapsed
    assert normalised(captured["stdout"].decode()) == (
        header("Script running with cell ID 1")
        + "start\n\n"
        + header("Script terminated")
        + STOPPED_IN_FETCH
    )
    assert b"Traceback" not in captured["stderr"]


@pytest.mark.slow
async def test_a_second_ctrl_c_exits_at_once(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        process, captured = await start_uncancellable(tmp_path)
        assert process.stdout is not None
        assert process.stderr is not None
        await collect_until(process.stdout, captured, "stdout", b"start\n")
        process.send_signal(signal.SIGINT)
        await collect_until(process.stdout, captured, "stdout", b"Script terminated")
        process.send_signal(signal.SIGINT)
        again_at = trio.current_time()
        status = await exit_status(process, captured)
        elapsed = trio.current_time() - again_at
    assert status == 130
    assert elapsed < 2, elapsed
    assert normalised(captured["stdout"].decode()).endswith(
        header("Script terminated") + STOPPED_IN_FETCH
    )
    assert captured["stderr"].decode() == (
        "codemode: interrupted again: exiting without cleaning up\n"
    )


@pytest.mark.slow
async def test_a_tool_raising_system_exit_rejects_only_its_call(tmp_path: Path) -> None:
    # needs the tool-containment fix (a tool's SystemExit rejects its call's promise)
    (tmp_path / "slow_tools.py").write_text(UNCANCELLABLE_TOOLS)
    (tmp_path / "exits.js").write_text(
        'try { await tools.exits(); } catch (e) { text("caught " + e); }\ntext("end");\n'
    )
    with trio.fail_after(10):
        result = await trio.run_process(
            [COMMAND, "run", "exits.js", "--tools", "slow_tools:toolbox"],
            cwd=tmp_path,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            deliver_cancel=kill,
        )
    assert result.returncode == 0, result.stderr.decode()
    output = normalised(result.stdout.decode())
    assert output.startswith(header("Script completed") + "caught ")
    assert output.endswith("\nend\n")


# ---- run and describe: usage errors ----------------------------------------------------------

BROKEN_MODULE = "raise RuntimeError('the tools are\\nbroken')\n"
EXITING_MODULE = "raise SystemExit(5)\n"
OTHER_TOOLS = """
import codemode
toolbox = codemode.Toolbox()

@toolbox.tool
def list_cities() -> list[str]:
    \"\"\"A clash with the weather tools.\"\"\"
    return []

class MyTools(codemode.Toolbox):
    pass
"""


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["run", "missing.js"], "codemode: cannot read missing.js: No such file or directory"),
        (["run", "script.js", "--tools", "examples.weather_tools"], "codemode: --tools expects MODULE:ATTR (like examples.weather_tools:toolbox), got 'examples.weather_tools'"),
        (["run", "script.js", "--tools", "examples/weather_tools.py:toolbox"], "codemode: --tools expects a dotted module name (like examples.weather_tools), got 'examples/weather_tools.py'"),
        (["run", "script.js", "--tools", "no_such_module:toolbox"], "codemode: cannot import no_such_module: ModuleNotFoundError: No module named 'no_such_module'"),
        (["run", "script.js", "--tools", "broken_tools:toolbox"], "codemode: cannot import broken_tools: RuntimeError: the tools are broken"),
        (["run", "script.js", "--tools", "exiting_tools:toolbox"], "codemode: cannot import exiting_tools: SystemExit: 5"),
        (["run", "script.js", "--tools", "other_tools:missing"], "codemode: module other_tools has no attribute 'missing'"),
        (["run", "script.js", "--tools", "other_tools:MyTools"], "codemode: other_tools:MyTools is a class, not a toolbox: name an instance of it (a codemode.Toolbox or the result of codemode.combine), such as `toolbox = MyTools()`"),
        (["run", "script.js", "--tools", "other_tools:codemode"], "codemode: other_tools:codemode is not a toolbox (a codemode.Toolbox or the result of codemode.combine), got module"),
        (["run", "script.js", *WEATHER_TOOLS, "--tools", "other_tools:toolbox"], "codemode: tool name list_cities is defined twice"),
        (["describe", "--tools", "other_tools:toolbox.nope"], "codemode: module other_tools has no attribute 'toolbox.nope'"),
        (["describe", "--api", "anthropic"], "codemode: describe: --api applies only with --json"),
    ],
)  # fmt: skip
async def test_usage_errors_are_one_line_and_status_2(
    tmp_path: Path, arguments: list[str], message: str
) -> None:
    # Run from a directory of its own: the working directory is where modules are found.
    (tmp_path / "script.js").write_text('text("never run");\n')
    (tmp_path / "broken_tools.py").write_text(BROKEN_MODULE)
    (tmp_path / "exiting_tools.py").write_text(EXITING_MODULE)
    (tmp_path / "other_tools.py").write_text(OTHER_TOOLS)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    result = await codemode(*arguments, cwd=tmp_path)
    assert (result.returncode, result.stdout) == (2, b"")
    assert result.stderr.decode() == message + "\n"


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        (["run"], "the following arguments are required: FILE.js"),
        (["run", "x.js", "--max-tokens", "-1"], "argument --max-tokens: must be between 0 and 2147483647, got -1"),
        # ExecuteRequest's bound; the yield time's is the pragma's, JavaScript's largest safe integer.
        (["run", "x.js", "--max-tokens", "3000000000"], "argument --max-tokens: must be between 0 and 2147483647, got 3000000000"),
        (["run", "x.js", "--yield-time-ms", str(2**53)], "argument --yield-time-ms: must be between 0 and 9007199254740991, got 9007199254740992"),
        (["run", "x.js", "--yield-time-ms", "soon"], "argument --yield-time-ms: expected a whole number, got 'soon'"),
        (["describe", "--json", "--api", "gemini"], "argument --api: invalid choice: 'gemini'"),
        (["serve"], "argument COMMAND: invalid choice: 'serve'"),
    ],
)  # fmt: skip
async def test_argument_errors_exit_2(arguments: list[str], error: str) -> None:
    result = await codemode(*arguments)
    assert (result.returncode, result.stdout) == (2, b"")
    assert result.stderr.decode().startswith("usage: codemode")
    assert error in result.stderr.decode()


async def test_help_lists_the_subcommands() -> None:
    result = await codemode("--help")
    assert result.returncode == 0
    assert re.search(rb"\n    run +run a JavaScript file as one cell", result.stdout)
    assert re.search(rb"\n    describe +print the exec tool's description", result.stdout)


# ---- describe ----------------------------------------------------------------------------------


async def test_describe_prints_the_exec_description_with_declarations() -> None:
    result = await codemode("describe", *WEATHER_TOOLS)
    assert (result.returncode, result.stderr) == (0, b"")
    description = result.stdout.decode()
    assert description == exec_description(toolbox.definitions()) + "\n"
    assert "### `forecast`\nThe forecast of a city for the next days." in description
    assert "  // How many days, 1 to 7.\n  days?: number;\n" in description

    without_tools = await codemode("describe")
    assert without_tools.stdout.decode() == exec_description([]) + "\n"


@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_describe_json_prints_the_tool_specs(api: ModelApi) -> None:
    result = await codemode("describe", *WEATHER_TOOLS, "--json", "--api", api)
    assert (result.returncode, result.stderr) == (0, b"")
    specs = json.loads(result.stdout)
    assert specs == tool_specs(api, toolbox.definitions())
    assert [spec["name"] for spec in specs] == ["exec", "wait"]


async def test_describe_json_defaults_to_openai() -> None:
    result = await codemode("describe", "--json")
    assert json.loads(result.stdout) == tool_specs("openai", [])
