"""The admission options of `codemode-host`: parsed into an `AdmissionLimits`.

`add_admission_options` adds them to any `argparse.ArgumentParser` (the program's own parser
takes them this way); `admission_from` reads them back. Each takes a positive integer; a bad
value is argparse's one-line error and exit status 2.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from codemode import AdmissionLimits

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
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


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


def parse_admission(argv: Sequence[str]) -> AdmissionLimits:
    """Parse the admission options alone from `argv` (exits with status 2 on a bad one)."""
    parser = argparse.ArgumentParser(
        prog="codemode-host", description="Serve the code-mode host protocol on stdin/stdout."
    )
    add_admission_options(parser)
    return admission_from(parser.parse_args(argv))
