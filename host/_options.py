"""The command line of `codemode-host`: its options, its `--help`, and the platform check.

The admission options (`add_admission_options`) are parsed into an `AdmissionLimits`.

Rules:
1. The host is started by a client (the process provider), never by hand, unless it listens
   on a socket (`--listen`, `_listen_options.py`): every option has a default that serves a
   client, and the program takes no positional argument.
2. A bad option prints one line saying what is wrong, on stderr, and exits with status 2
   (argparse's convention); nothing is read from stdin before the options are good.
3. The host runs only on Linux (it needs eventfd, pidfd and `F_SETPIPE_SZ`): elsewhere it exits
   with status 2 and one line saying so, before it reads a frame (where the engine's extension
   could be built at all).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

import msgspec
from codemode_host._listen_options import ListenSettings, add_listen_options, listen_settings
from codemode_host.engine import DEFAULT_MAX_WORKERS, MAX_WORKERS

from codemode import AdmissionLimits
from codemode.errors import UnsupportedPlatformError

LOG_VARIABLE = "CODEMODE_HOST_LOG"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

DESCRIPTION = """\
The codemode host: runs code-mode cells (JavaScript written by a model) in QuickJS-ng and
serves the codemode wire protocol (length-prefixed msgpack frames) on stdin and stdout. It is
started by codemode's process provider (codemode.open_process_provider), not by hand; it exits
when stdin closes or when the client process that started it exits. Logs go to stderr.

With --listen it serves clients on a socket instead (codemode.open_remote_provider), one
connection per client, each with its own sessions and admission limits, until SIGTERM or SIGINT.
"""

EPILOG = f"""\
environment:
  {LOG_VARIABLE}      default log level (one of {", ".join(LOG_LEVELS)}; default WARNING)
  CODEMODE_HOST_PARENT   pid of the client process to watch (set by the process provider)
  CODEMODE_HOST_TOKEN    the token clients must send, with --listen (--token-file wins)
  OTEL_*                 with --otel: OpenTelemetry's standard variables (OTEL_SERVICE_NAME,
                         OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_TRACES_EXPORTER, ...)

See docs/protocol.md for the wire protocol and docs/security.md for what the host isolates.
"""


class HostOptions(msgspec.Struct, frozen=True, kw_only=True):
    """The parsed command line.

    Parameters
    ----------
    log_level: the logging level name for stderr.
    workers: native engine worker threads to start with (None: one per core).
    max_workers: the most engine worker threads the pool grows to (None: the engine's
        default, or `admission.max_active_cells` if higher).
    admission: the admission limits of each connection.
    listen: where to listen (`--listen`, `_listen_options.py`); None: serve stdin/stdout.
    otel: report traces and metrics to OpenTelemetry (`--otel`, `_otel.py`).
    """

    log_level: str
    workers: int | None
    max_workers: int | None
    admission: AdmissionLimits = AdmissionLimits()
    listen: ListenSettings | None = None
    otel: bool = False


_DEFAULTS = AdmissionLimits()

_OPTIONS = (
    (
        "max_requests_in_flight",
        "requests one connection serves at once; one more is refused with"
        " `code-mode host has too many in-flight requests`",
    ),
    (
        "max_active_cells",
        "cells running, draining or terminating at once, every session together; one more"
        " is refused with `code-mode host has too many active cells`",
    ),
    (
        "max_pending_delegate_calls",
        "tool calls and notifications in flight to the client at once; a tool call past it"
        " rejects its promise with `code-mode host has too many pending delegate calls`",
    ),
    (
        "max_uncollected_results",
        "completed cells of one session whose result nobody collected; past it that"
        " session's executes are refused until one is collected",
    ),
)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _worker_count(text: str) -> int:
    value = _positive(text)
    if value > MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_WORKERS} workers, got {text!r}")
    return value


def _level(text: str) -> str:
    level = text.upper()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(LOG_LEVELS)}, got {text!r}")
    return level


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad option is one line: the client that spawned the host logs its
    stderr line by line, and a usage block would bury the reason."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _VersionAction(argparse.Action):
    """`--version`: the installed version, looked up only when asked for. Every host start
    parses its options, and `importlib.metadata` (its import and the look-up) cost about 12 ms
    of a cold start of about 200 ms."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> NoReturn:
        from importlib.metadata import PackageNotFoundError, version

        try:
            installed = version("codemode")
        except PackageNotFoundError:  # pragma: no cover - run from a source tree
            installed = "unknown"
        sys.stdout.write(f"{parser.prog} {installed}\n")  # where argparse's own action prints
        parser.exit(0)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="codemode-host",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action=_VersionAction, help="show program's version number and exit"
    )
    parser.add_argument(
        "--log-level",
        type=_level,
        default=None,
        metavar="LEVEL",
        help=f"log level on stderr (default: ${LOG_VARIABLE}, else WARNING)",
    )
    parser.add_argument(
        "--workers",
        type=_worker_count,
        default=None,
        metavar="N",
        help="native engine worker threads to start with (default: one per core)",
    )
    parser.add_argument(
        "--max-workers",
        type=_worker_count,
        default=None,
        metavar="N",
        help="the most engine worker threads the pool grows to while long-running cells "
        f"hold the others (default: {DEFAULT_MAX_WORKERS})",
    )
    parser.add_argument(
        "--otel",
        action="store_true",
        help="report each cell's spans (under the client's trace) and the host's metrics to "
        "OpenTelemetry, configured by the OTEL_* variables (OTLP over HTTP by default); needs "
        "codemode[otel-sdk] (docs/observability.md)",
    )
    add_admission_options(parser)
    add_listen_options(parser)
    return parser


def add_admission_options(parser: argparse.ArgumentParser) -> None:
    """Add `--max-requests-in-flight`, `--max-active-cells`, `--max-pending-delegate-calls`
    and `--max-uncollected-results` to `parser`, in a group of their own."""
    group = parser.add_argument_group(
        "admission", "how much work the host takes at once (docs/limits.md)"
    )
    for name, text in _OPTIONS:
        default = getattr(_DEFAULTS, name)
        group.add_argument(
            "--" + name.replace("_", "-"),
            type=_positive,
            default=default,
            metavar="N",
            help=f"{text} (default: {default})",
        )


def admission_from(options: argparse.Namespace) -> AdmissionLimits:
    """The limits the parsed options name."""
    return AdmissionLimits(**{name: getattr(options, name) for name, _ in _OPTIONS})


def parse_options(argv: Sequence[str] | None = None) -> HostOptions:
    """The options of `argv` (default: `sys.argv[1:]`).

    Raises:
        SystemExit: status 0 after `--help` or `--version`; status 2 after a bad option or on
            a platform other than Linux, with one line on stderr saying why.
    """
    parser = _parser()
    arguments = parser.parse_args(argv)
    if not sys.platform.startswith("linux"):
        parser.exit(2, f"codemode-host: error: {UnsupportedPlatformError(sys.platform)}\n")
    log_level = arguments.log_level
    if log_level is None:
        log_level = os.environ.get(LOG_VARIABLE, "WARNING").upper()
        if log_level not in LOG_LEVELS:
            parser.error(f"${LOG_VARIABLE}: expected one of {', '.join(LOG_LEVELS)}")
    return HostOptions(
        log_level=log_level,
        workers=arguments.workers,
        max_workers=arguments.max_workers,
        admission=admission_from(arguments),
        listen=listen_settings(parser, arguments),
        otel=arguments.otel,
    )


def parse_admission(argv: Sequence[str]) -> AdmissionLimits:
    """The admission limits of a command line (the other options at their defaults)."""
    return parse_options(argv).admission
