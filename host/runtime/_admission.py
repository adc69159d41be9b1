"""Admission: the capacity one host connection (or one in-process provider) shares.

Every session of a connection takes its cells' slots and its delegate calls' slots from one
`Admission` (design.md, host 4.1, era D). Requests in flight are counted by the sans-IO
`HostConnection`, which answers them before they reach the runtime.

Rules:
1. A cell takes an active-cell slot when it is admitted and gives it back when its lifecycle
   leaves the ACTIVE states (`_phases.ACTIVE`): a completion nobody collected holds no slot.
2. Uncollected completions are bounded per session instead (`max_uncollected_results`): past
   it the session refuses new cells with an exact text; nothing is dropped. The session's
   cells keep its count (`_share.CellShare.uncollected`).
3. A tool call or notification takes a pending-call slot when the cell makes it and gives it
   back when its task ends (or when the cell drops it unstarted). A tool call past the bound
   rejects its promise at once and never reaches the delegate.
4. The engine may grow to at least as many workers as there are active-cell slots
   (`worker_ceiling`), up to the engine's bound (`MAX_WORKERS`, 1,024): spinning cells up to
   the cap never keep another cell from a worker. (Past 1,024 active cells, spinning cells
   can.)
"""

from __future__ import annotations

from codemode_host.engine import DEFAULT_MAX_WORKERS, MAX_WORKERS

from codemode import AdmissionLimits
from codemode.errors import TOO_MANY_CELLS, AdmissionError, too_many_uncollected


class Admission:
    """The slots of one connection or provider.

    Args:
        limits: the bounds (defaults: `AdmissionLimits()`).

    Attributes:
        active_cells: cells that hold an active-cell slot.
        pending_calls: delegate calls that hold a pending-call slot.
    """

    __slots__ = ("active_cells", "limits", "pending_calls")

    def __init__(self, limits: AdmissionLimits | None = None) -> None:
        self.limits = limits or AdmissionLimits()
        self.active_cells = 0
        self.pending_calls = 0

    def admit_cell(self, uncollected: int) -> None:
        """Take an active-cell slot for a new cell of a session holding `uncollected`
        completions nobody collected.

        Raises:
            AdmissionError: every slot is taken, or the session holds too many results.
        """
        if uncollected >= self.limits.max_uncollected_results:
            raise AdmissionError(too_many_uncollected(self.limits.max_uncollected_results))
        if self.active_cells >= self.limits.max_active_cells:
            raise AdmissionError(TOO_MANY_CELLS)
        self.active_cells += 1

    def release_cell(self) -> None:
        self.active_cells -= 1

    def take_call(self) -> bool:
        """Take a pending-call slot; False (nothing taken) when every slot is taken."""
        if self.pending_calls >= self.limits.max_pending_delegate_calls:
            return False
        self.pending_calls += 1
        return True

    def release_call(self) -> None:
        self.pending_calls -= 1


def worker_ceiling(limits: AdmissionLimits) -> int:
    """The `max_workers` to start the engine with (rule 4)."""
    return min(MAX_WORKERS, max(DEFAULT_MAX_WORKERS, limits.max_active_cells))
