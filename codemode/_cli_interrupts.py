"""Ctrl-C in the `codemode` command before its event loop takes SIGINT over.

Python raises a Ctrl-C's KeyboardInterrupt in whatever code the main thread runs when the signal's
handler does. When that code is a callback whose exceptions the interpreter reports and drops (the
import system's module-lock weakref callback, run at the end of every import; a `__del__`), the
KeyboardInterrupt is lost and the command runs on as if no Ctrl-C had come: a Ctrl-C while
`codemode` or a tool module is imported could leave `codemode run spin.js` spinning.

Rules:
1. From `EarlyInterrupts.install` (the console script's guard, `codemode_cli.py`, installs the
   same kind of handler before it imports `codemode`), each SIGINT is noted as well as raised,
   and `check` raises KeyboardInterrupt for one that was noted but dropped. The command checks at
   each step a Ctrl-C must stop: after the imports, after loading the tools.
2. The report Python writes for a KeyboardInterrupt it dropped is left out (the command says
   nothing else about a Ctrl-C before the cell started); other such reports are written as before.
3. `hand_over`, just before `trio.run`, makes a SIGINT only noted: trio installs its own
   KeyboardInterrupt handling only over Python's default handler, and `codemode run` takes SIGINT
   over with a signal receiver as its first step, then calls `redeliver`, which raises a noted
   Ctrl-C again for that receiver. `restore` puts Python's default handling back.
4. Outside the main thread nothing is installed (Python allows signal handlers only there), and
   every method does nothing.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType


class EarlyInterrupts:
    """SIGINT's handler from the command's start until its event loop takes SIGINT over.

    Parameters:
        noted: the SIGINTs noted so far, shared with the handler the console script installed
            before `codemode` was imported.
    """

    def __init__(self, noted: list[int] | None = None) -> None:
        self.noted: list[int] = [] if noted is None else noted
        self._raising = True
        self._installed = False
        self._previous_hook = sys.unraisablehook

    @classmethod
    def install(cls, noted: list[int] | None = None) -> EarlyInterrupts:
        """A handler noting `noted` and later SIGINTs, installed if this is the main thread."""
        interrupts = cls(noted)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, interrupts._handle)
            sys.unraisablehook = interrupts._report_unraisable
            interrupts._installed = True
        return interrupts

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.noted.append(signum)
        if self._raising:
            raise KeyboardInterrupt

    def _report_unraisable(self, unraisable: sys.UnraisableHookArgs) -> None:
        if not (self.noted and isinstance(unraisable.exc_value, KeyboardInterrupt)):
            self._previous_hook(unraisable)

    def check(self) -> None:
        """Raise KeyboardInterrupt if a Ctrl-C came (rule 1)."""
        if self.noted:
            raise KeyboardInterrupt

    def hand_over(self) -> None:
        """From now on a Ctrl-C is only noted, for `redeliver` (rule 3)."""
        self._raising = False

    def redeliver(self) -> None:
        """Raise SIGINT again if one came since `hand_over`, for whoever handles it now."""
        if self._installed and self.noted:
            signal.raise_signal(signal.SIGINT)

    def restore(self) -> None:
        """Python's default SIGINT handling and report of dropped exceptions again."""
        if self._installed:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            sys.unraisablehook = self._previous_hook
            self._installed = False
