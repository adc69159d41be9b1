"""The `codemode` command: run a JavaScript file as a cell, or describe the model's tools.

    codemode run FILE.js [--tools MODULE:ATTR]... [--yield-time-ms N] [--max-tokens N]
                         [--in-process]
    codemode describe [--tools MODULE:ATTR]... [--json [--api openai|anthropic]]
    codemode mcp serve [--server NAME=COMMAND_OR_URL]... [--config FILE] [--tools MODULE:ATTR]...
                       [--http HOST:PORT [--token-file FILE]] [--in-process]

Exit status: 0 the cell completed, 1 it failed (or codemode itself failed: one line on standard
error), 2 a usage error, 3 it was terminated (SIGTERM terminates it), 130 interrupted (Ctrl-C
terminates it too), 141 standard output was closed early (`codemode run big.js | head -1`).

Rules:
1. Standard output holds exactly what the model would see (`run`) or read (`describe`);
   anything else (progress, notifications, logs, errors) goes to standard error.
2. A usage error is one line on standard error and exit status 2, never a traceback.
3. `--yield-time-ms` and `--max-tokens` take the ranges `ExecuteRequest` takes (the yield time
   also within what the exec pragma, a JSON number, carries exactly).
4. An error of codemode's own (`CodeModeError`: a host that did not start or was lost, a
   refused request) is one line on standard error and exit status 1, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ._api import MAX_OUTPUT_TOKENS, MAX_YIELD_TIME_MS
from ._cli_inputs import UsageError, load_tools, read_source
from ._cli_interrupts import EarlyInterrupts
from .errors import CodeModeError
from .model._pragma import MAX_SAFE_INTEGER

if TYPE_CHECKING:
    from .observability import InMemoryTrace

FAILED = 1
USAGE_ERROR = 2
INTERRUPTED = 130

MAX_YIELD_TIME_OPTION = min(MAX_YIELD_TIME_MS, MAX_SAFE_INTEGER)
"""The largest `--yield-time-ms`: the option is written into the exec pragma, whose numbers
stop at JavaScript's largest safe integer, below `ExecuteRequest`'s bound (rule 3)."""


def _count(high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if not 0 <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between 0 and {high}, got {value}")
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="codemode",
        description="Run JavaScript cells the way a model's exec tool does, with Python tools.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    tools_help = (
        "a toolbox to enable, as a dotted module and attribute (examples.weather_tools:toolbox); "
        "the working directory is importable; repeat to combine several"
    )

    run = commands.add_parser(
        "run",
        help="run a JavaScript file as one cell and print what the model would see",
        description=(
            "Run FILE as one exec cell, waiting through its yields, and print each response's "
            "items as the model sees them (a blank line between responses). Exit status: 0 "
            "completed, 1 failed, 2 usage error, 3 terminated (SIGTERM terminates the cell), "
            "130 interrupted (Ctrl-C terminates the cell; a second Ctrl-C exits at once), 141 "
            "standard output closed early."
        ),
    )
    run.add_argument("file", metavar="FILE.js", help="the JavaScript source of the cell")
    run.add_argument("--tools", action="append", default=[], metavar="MODULE:ATTR", help=tools_help)
    run.add_argument(
        "--yield-time-ms",
        type=_count(MAX_YIELD_TIME_OPTION),
        metavar="N",
        help=(
            "yield after N ms (exec and each wait; default: the file's pragma, or 10000); a "
            "wait that sees no output keeps watching for at least 1000 ms"
        ),
    )
    run.add_argument(
        "--max-tokens",
        type=_count(MAX_OUTPUT_TOKENS),
        metavar="N",
        help="token budget of each response (default: the file's pragma, or 10000)",
    )
    run.add_argument(
        "--in-process",
        action="store_true",
        help="run the cell in this process instead of a host process",
    )
    run.add_argument(
        "--approve",
        choices=("ask", "allow", "deny"),
        help=(
            "decide the calls of tools that need approval: ask (a prompt on stderr, the answer "
            "from stdin), allow or deny (default: ask when stdin is a terminal, else deny)"
        ),
    )
    run.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="TOOL",
        help="allow calls of the tools matching this pattern (`send_*`); repeatable",
    )
    run.add_argument(
        "--deny",
        action="append",
        default=[],
        metavar="TOOL",
        help="deny calls of the tools matching this pattern (before --allow); repeatable",
    )
    run.add_argument(
        "--trace",
        action="store_true",
        help=(
            "after the output, print the run's span tree with timings on stderr (needs "
            "codemode[otel-sdk]; docs/observability.md)"
        ),
    )

    describe = commands.add_parser(
        "describe",
        help="print the exec tool's description, or the model's tool specs as JSON",
        description=(
            "Print the exec tool's description with the declarations of the enabled tools, or "
            "with --json the exec and wait tool specs for a model API."
        ),
    )
    describe.add_argument(
        "--tools", action="append", default=[], metavar="MODULE:ATTR", help=tools_help
    )
    describe.add_argument("--json", action="store_true", help="print the tool specs as JSON")
    describe.add_argument(
        "--api",
        choices=["openai", "anthropic"],
        help="the model API of the JSON specs (with --json; default openai)",
    )
    _mcp_parser(commands, tools_help)
    return parser


def _mcp_parser(commands: Any, tools_help: str) -> None:
    mcp = commands.add_parser(
        "mcp",
        help="MCP: serve code mode to MCP clients",
        description="Model Context Protocol commands (need: pip install 'codemode[mcp]').",
    )
    mcp_commands = mcp.add_subparsers(dest="mcp_command", required=True, metavar="COMMAND")
    serve = mcp_commands.add_parser(
        "serve",
        help="an MCP server exposing code mode's exec and wait tools",
        description=(
            "Serve code mode as an MCP server with two tools, exec and wait, over stdio (or "
            "streamable HTTP with --http). Cells may call the --tools toolboxes and the tools "
            "of the MCP servers given with --server and --config."
        ),
    )
    serve.add_argument(
        "--server",
        action="append",
        default=[],
        metavar="NAME=COMMAND_OR_URL",
        help=(
            "an MCP server whose tools the cells get as tools.mcp__NAME__*: a command, split "
            "like a shell would, or an http(s):// URL of a streamable HTTP server; repeatable"
        ),
    )
    serve.add_argument(
        "--config", metavar="FILE", help='MCP servers from a JSON file of {"mcpServers": {...}}'
    )
    serve.add_argument(
        "--tools", action="append", default=[], metavar="MODULE:ATTR", help=tools_help
    )
    serve.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="serve streamable HTTP at http://HOST:PORT/mcp instead of stdio (port 0: any)",
    )
    serve.add_argument(
        "--token-file",
        metavar="FILE",
        help="require 'Authorization: Bearer <the file's token>' (needed off loopback)",
    )
    serve.add_argument(
        "--in-process",
        action="store_true",
        help="run the cells in this process instead of a host process",
    )
    serve.add_argument(
        "--otel",
        action="store_true",
        help=(
            "report spans and metrics to OpenTelemetry, configured by the OTEL_* variables "
            "(OTLP over HTTP by default), continuing a client's traceparent; needs "
            "codemode[otel-sdk] (docs/observability.md)"
        ),
    )


def main(argv: Sequence[str] | None = None, *, noted_interrupts: list[int] | None = None) -> int:
    """Run the `codemode` command.

    Args:
        argv: the arguments (default: `sys.argv[1:]`).
        noted_interrupts: the Ctrl-Cs the console script's guard noted while `codemode` was
            imported (`codemode_cli.py`); one there ends the command with status 130.

    Returns:
        The exit status.
    """
    interrupts = EarlyInterrupts.install(noted_interrupts)
    try:
        interrupts.check()
        arguments = _parser().parse_args(argv)
        logging.basicConfig(level=logging.WARNING, format="codemode: %(name)s: %(message)s")
        if arguments.command == "describe":
            return _describe(arguments, interrupts)
        if arguments.command == "mcp":
            interrupts.restore()  # the server's trio run handles Ctrl-C from here
            return _mcp_serve(arguments)
        return _run(arguments, interrupts)
    except UsageError as error:
        print(f"codemode: {error}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:  # before the cell started (importing the tools, say)
        return INTERRUPTED
    except (CodeModeError, BaseExceptionGroup) as error:
        found = _codemode_error(error)
        if found is None:
            raise
        print(f"codemode: {_one_line(str(found))}", file=sys.stderr)
        return USAGE_ERROR if isinstance(found, UsageError) else FAILED
    finally:
        interrupts.restore()


def _codemode_error(error: BaseException) -> CodeModeError | None:
    """The library error `error` is, or the first of a group that holds only such errors."""
    if isinstance(error, CodeModeError):
        return error
    if not isinstance(error, BaseExceptionGroup):
        return None
    found = [_codemode_error(inner) for inner in error.exceptions]
    if not found or any(inner is None for inner in found):
        return None
    return found[0]


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _mcp_serve(arguments: argparse.Namespace) -> int:
    try:
        from .mcp._cli import ServeOptions, run
    except ImportError as error:
        from .mcp._sdk import MISSING_SDK

        if str(error) != MISSING_SDK:
            raise
        raise UsageError(MISSING_SDK) from error
    options = ServeOptions(
        servers=arguments.server,
        config=arguments.config,
        tools=arguments.tools,
        http=arguments.http,
        token_file=arguments.token_file,
        in_process=arguments.in_process,
    )
    if not arguments.otel:
        return run(options)
    from .observability import SdkMissingError, install_from_environment

    try:
        flush = install_from_environment("codemode-mcp", "codemode mcp serve --otel")
    except SdkMissingError as error:
        raise UsageError(str(error)) from None
    try:
        return run(options)
    finally:
        flush()


def _describe(arguments: argparse.Namespace, interrupts: EarlyInterrupts) -> int:
    from .model import exec_description, tool_specs

    if arguments.api is not None and not arguments.json:
        raise UsageError("describe: --api applies only with --json")
    definitions = load_tools(arguments.tools).definitions()
    interrupts.check()
    if arguments.json:
        specs = tool_specs(arguments.api or "openai", definitions)
        sys.stdout.write(json.dumps(specs, indent=2, ensure_ascii=False) + "\n")
    else:
        sys.stdout.write(exec_description(definitions) + "\n")
    return 0


def _run(arguments: argparse.Namespace, interrupts: EarlyInterrupts) -> int:
    import trio

    from ._cli_run import RunOptions, run_file, start_exit_watchdog

    source = read_source(arguments.file)
    tools = load_tools(arguments.tools)
    trace = _trace() if arguments.trace else None
    options = RunOptions(
        yield_time_ms=arguments.yield_time_ms,
        max_tokens=arguments.max_tokens,
        in_process=arguments.in_process,
        approve=arguments.approve,
        allow=tuple(arguments.allow),
        deny=tuple(arguments.deny),
    )
    watchdogs = []

    async def run_then_watch() -> int:
        status = await run_file(
            source, tools, options, sys.stdout, sys.stderr, interrupts=interrupts
        )
        # `trio.run` still waits for delegate calls the provider abandoned (a tool that ignores
        # cancellation): that wait is bounded too.
        watchdogs.append(start_exit_watchdog(status))
        return status

    interrupts.check()
    interrupts.hand_over()  # run_file's signal receiver takes SIGINT over
    try:
        return trio.run(run_then_watch)
    finally:
        for watchdog in watchdogs:
            watchdog.cancel()
        if trace is not None:
            from .observability import render_tree

            sys.stderr.write(f"trace:\n{render_tree(trace.spans())}\n")
            trace.close()


def _trace() -> InMemoryTrace:
    """`--trace`: spans kept in memory for the tree printed after the run.

    Raises:
        UsageError: the OpenTelemetry SDK is not installed (one line naming the extra).
    """
    from .observability import InMemoryTrace, SdkMissingError

    try:
        return InMemoryTrace()
    except SdkMissingError as error:
        raise UsageError(str(error)) from None
