"""The `codemode` console script's entry: `codemode.cli.main` behind a Ctrl-C guard.

Rules:
1. Importing `codemode` takes tens of milliseconds (trio, msgspec, the model layer); a Ctrl-C
   in that time must end the command like any other Ctrl-C before the cell started: status 130
   and no traceback. The guard is a top-level module of its own because any module inside the
   `codemode` package imports the whole package before its first line runs.
2. Python drops a KeyboardInterrupt raised inside some callbacks, such as the one that ends each
   import (`codemode/_cli_interrupts.py` says which and why): the guard's SIGINT handler notes
   each Ctrl-C as well as raising it, hands its notes to the command, which ends with 130 if one
   came, and leaves out Python's report of the KeyboardInterrupt it dropped.
3. This module imports nothing but `signal` and `sys` outside the guard.
"""

from __future__ import annotations

import signal
import sys

TYPE_CHECKING = False  # `typing` is not imported outside the guard (rule 3)
if TYPE_CHECKING:
    from types import FrameType

INTERRUPTED = 130
"""The status of a command ended by Ctrl-C (128 + SIGINT), as `codemode.cli` documents."""


def main() -> int:
    """Run the `codemode` command (the console script's entry).

    Returns:
        The exit status.
    """
    noted: list[int] = []
    report_unraisable = sys.unraisablehook

    def note(signum: int, frame: FrameType | None) -> None:
        noted.append(signum)
        raise KeyboardInterrupt

    def report(unraisable: sys.UnraisableHookArgs) -> None:
        if not (noted and isinstance(unraisable.exc_value, KeyboardInterrupt)):
            report_unraisable(unraisable)

    signal.signal(signal.SIGINT, note)
    sys.unraisablehook = report
    try:
        from codemode.cli import main as command

        return command(noted_interrupts=noted)
    except KeyboardInterrupt:
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
