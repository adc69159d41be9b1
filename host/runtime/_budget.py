"""A session's budgets: the tool calls and the CPU time all its cells together may use
(`CellLimits.max_session_tool_calls`, `max_session_cpu_time_ms`; docs/governance.md,
"Deadlines and budgets").

Rules:
1. The count is kept whether or not a budget is set: `usage()` reports it either way.
2. A tool call counts once it passed the budget and admission (it reaches its delegate); a
   call made once the tool call budget is used up rejects its promise at once with
   `session tool call budget of N calls is used up`, and never reaches the delegate.
3. CPU time counts as the cells report it: at the end of every turn (`Idle`) and at their end
   (`Finished`, which includes the last turn). Once the count reaches the CPU budget, the
   session's next execute is refused (`AdmissionError`: `session CPU budget of N ms is used
   up`); cells running then go on, each within its own `max_cpu_time_ms`.
4. The budget belongs to the runtime's session: a session re-opened on a new host (its host
   was lost) starts a new count there.
"""

from __future__ import annotations

from codemode import CellLimits, SessionUsage
from codemode.errors import AdmissionError, cpu_budget_used_up, tool_call_budget_used_up


class SessionBudget:
    """The budgets of one session and what its cells used of them.

    Args:
        limits: the session's limits (their `max_session_*` fields).
    """

    __slots__ = ("_max_cpu_us", "_max_tool_calls", "cpu_us", "tool_calls")

    def __init__(self, limits: CellLimits) -> None:
        self._max_tool_calls = limits.max_session_tool_calls
        cpu_ms = limits.max_session_cpu_time_ms
        self._max_cpu_us = None if cpu_ms is None else cpu_ms * 1000
        self.tool_calls = 0
        self.cpu_us = 0

    def admit_cell(self) -> None:
        """A new cell may start (rule 3).

        Raises:
            AdmissionError: the CPU budget is used up.
        """
        if self._max_cpu_us is not None and self.cpu_us >= self._max_cpu_us:
            raise AdmissionError(cpu_budget_used_up(self._max_cpu_us // 1000))

    def tool_call_refusal(self) -> str | None:
        """The rejection of a new tool call (rule 2), or None if the budget allows it."""
        budget = self._max_tool_calls
        if budget is not None and self.tool_calls >= budget:
            return tool_call_budget_used_up(budget)
        return None

    def usage(self) -> SessionUsage:
        """What the session's cells used so far."""
        return SessionUsage(tool_calls=self.tool_calls, cpu_time_ms=self.cpu_us / 1000)
