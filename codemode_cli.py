"""The `codemode` console script's entry: `codemode.cli.main` behind a Ctrl-C guard.

Rules:
1. Importing `codemode` takes tens of milliseconds (trio, msgspec, the model layer); a Ctrl-C
   in that time must end the command like any other Ctrl-C before the cell started: status 130
   and no traceback. The guard is a top-level module of its own because any module inside the
   `codemode` package imports the whole package before its first line runs.
2. This module imports nothing but `sys` outside the guard.
"""

from __future__ import annotations

import sys

INTERRUPTED = 130
"""The status of a command ended by Ctrl-C (128 + SIGINT), as `codemode.cli` documents."""


def main() -> int:
    """Run the `codemode` command (the console script's entry).

    Returns:
        The exit status.
    """
    try:
        from codemode.cli import main as command

        return command()
    except KeyboardInterrupt:
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
