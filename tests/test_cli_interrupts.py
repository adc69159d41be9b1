"""Ctrl-C before `codemode run`'s event loop takes SIGINT over (`codemode/_cli_interrupts.py`):
noted as well as raised, taken again once the run's signal receiver is in place.

These tests call the handler in this process; `tests/test_cli.py` drives the command itself,
including a Ctrl-C that Python drops while a tool module is imported.
"""

from __future__ import annotations

import io
import signal
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from codemode import Toolbox
from codemode._cli_interrupts import EarlyInterrupts
from codemode._cli_run import INTERRUPTED, RunOptions, run_file
from codemode._combine import combine


@pytest.fixture
def handlers() -> Iterator[None]:
    """SIGINT's handler and the unraisable hook as they were, put back after the test."""
    handler = signal.getsignal(signal.SIGINT)
    hook = sys.unraisablehook
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)
        sys.unraisablehook = hook


def test_a_ctrl_c_is_raised_and_noted_then_only_noted_once_handed_over(handlers: None) -> None:
    interrupts = EarlyInterrupts.install()
    interrupts.check()  # none yet
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
    assert interrupts.noted == [signal.SIGINT]
    with pytest.raises(KeyboardInterrupt):
        interrupts.check()
    interrupts.hand_over()
    signal.raise_signal(signal.SIGINT)  # noted only: the event loop's receiver takes it later
    assert interrupts.noted == [signal.SIGINT, signal.SIGINT]
    interrupts.restore()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_the_notes_of_the_console_scripts_guard_are_shared(handlers: None) -> None:
    noted: list[int] = [signal.SIGINT]  # the guard noted a Ctrl-C while `codemode` was imported
    interrupts = EarlyInterrupts.install(noted)
    with pytest.raises(KeyboardInterrupt):
        interrupts.check()
    interrupts.restore()


def test_a_dropped_keyboard_interrupt_goes_unreported_and_others_are_reported(
    handlers: None,
) -> None:
    reported: list[type[BaseException] | None] = []
    sys.unraisablehook = lambda unraisable: reported.append(unraisable.exc_type)
    interrupts = EarlyInterrupts.install()

    class Dropping:
        def __init__(self, error: BaseException) -> None:
            self.error = error

        def __del__(self) -> None:
            raise self.error

    Dropping(ValueError("reported"))
    assert reported == [ValueError]
    Dropping(KeyboardInterrupt())  # no Ctrl-C noted: not one of ours, so reported
    assert reported == [ValueError, KeyboardInterrupt]
    interrupts.noted.append(signal.SIGINT)
    Dropping(KeyboardInterrupt())  # the KeyboardInterrupt of a noted Ctrl-C: left out
    assert reported == [ValueError, KeyboardInterrupt]
    interrupts.restore()
    Dropping(ValueError("reported again"))
    assert reported == [ValueError, KeyboardInterrupt, ValueError]


async def test_a_ctrl_c_noted_after_the_hand_over_ends_the_run_before_its_cell(
    handlers: None,
) -> None:
    calls: list[Any] = []
    toolbox = Toolbox()

    @toolbox.tool
    def record() -> str:
        """Records that the cell ran."""
        calls.append("record")
        return "recorded"

    interrupts = EarlyInterrupts.install()
    interrupts.hand_over()
    signal.raise_signal(signal.SIGINT)  # came while trio was starting: noted only
    out, err = io.StringIO(), io.StringIO()
    with trio.fail_after(30):
        status = await run_file(
            "await tools.record();\n",
            combine(toolbox),
            RunOptions(in_process=True),
            out,
            err,
            interrupts=interrupts,
        )
    assert status == INTERRUPTED
    assert out.getvalue() == ""
    assert "interrupted before the cell started" in err.getvalue()
    assert calls == []
