"""A traced cell's life as its runtime saw it: a few wall-clock stamps and counts, gathered while
the cell runs and turned into its `CellReport` when it closes (rule 11 of `_cell`).

Nothing of the cell's source, arguments, results or output is kept: only times, counts and the
kind of its end, told from the engine's outcome and its own error texts (docs/limits.md).
"""

from __future__ import annotations

import time

from codemode_host.engine import Finished, Outcome

from codemode.observability import CellReport, error_type

_HEAP_TEXT = "InternalError: out of memory"
_OUTPUT_TEXT = "exec cell output exceeds its pending output limit"


class Life:
    """The stamps and counts of a cell that reports its life (rule 11 of `_cell`)."""

    __slots__ = (
        "admitted_ns",
        "error_type",
        "finished_ns",
        "heap_bytes",
        "outcome",
        "output_bytes",
        "setup_ns",
        "started_ns",
        "yields_ns",
    )

    def __init__(self, admitted_ns: int) -> None:
        self.admitted_ns = admitted_ns
        self.started_ns = 0
        self.setup_ns = 0
        self.finished_ns = 0
        self.heap_bytes = 0
        self.output_bytes = 0
        self.yields_ns: list[int] = []
        self.outcome: str | None = None  # set by a termination, or by the JavaScript's end
        self.error_type: str | None = None

    def finished(self, finished: Finished, *, time_is_up: bool = False) -> None:
        self.finished_ns = time.time_ns()
        self.heap_bytes = finished.heap_bytes
        if self.outcome is not None:
            return  # terminated first
        if time_is_up and finished.outcome is Outcome.INTERRUPTED:
            self.outcome = "time_limit"
            return
        text = finished.error_text or ""
        if finished.error_text is not None and finished.outcome is not Outcome.CPU_LIMIT:
            self.error_type = error_type(finished.error_text)
        if finished.outcome is Outcome.OK:
            self.outcome = "completed"
        elif finished.outcome is Outcome.CPU_LIMIT:
            self.outcome = "cpu_limit"
        elif text.startswith(_HEAP_TEXT):  # the engine's own texts (docs/limits.md)
            self.outcome = "heap_limit"
        elif _OUTPUT_TEXT in text.partition("\n")[0]:
            self.outcome = "output_limit"
        else:
            self.outcome = "error"

    def report(self, turns: int, cpu_ms: float, tool_call_ns: list[int]) -> CellReport:
        return CellReport(
            outcome=self.outcome or "terminated",
            error_type=self.error_type,
            admitted_ns=self.admitted_ns,
            started_ns=self.started_ns,
            finished_ns=self.finished_ns,
            closed_ns=time.time_ns(),
            setup_ns=self.setup_ns,
            turns=turns,
            cpu_ms=cpu_ms,
            heap_bytes=self.heap_bytes,
            output_bytes=self.output_bytes,
            yields_ns=self.yields_ns,
            tool_call_ns=tool_call_ns,
        )
