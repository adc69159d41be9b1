"""The limits of codemode's public API: the bounds of a request's numbers, a session's cell
limits, a host's admission limits, and what `Session.cells()` reports about the cells that hold
capacity (docs/limits.md).

The request bounds are defined here once: `ExecuteRequest` and `WaitRequest` enforce them, and
every place that turns outside input into a request (the `exec` pragma, the `wait` arguments,
the command line) checks the same numbers first, so an out-of-range value is refused there with
a text for whoever wrote it instead of an `InvalidRequestError` from deep inside.

Each is a frozen `msgspec.Struct` with keyword-only fields (they travel on the wire as they are);
`codemode` re-exports them.
"""

from __future__ import annotations

import msgspec

from .errors import InvalidRequestError

MAX_YIELD_TIME_MS = 2**63 - 1
"""The longest observation window a request may ask for (the reference carries it as u64; the
wire's signed 64-bit integers stop here)."""
MAX_OUTPUT_TOKENS = 2**31 - 1
"""The largest token budget a request may ask for: the reference carries `max_output_tokens` as
a signed 32-bit integer."""

DEFAULT_HEAP_SIZE_BYTES = 256 << 20
"""A cell's JavaScript heap when `CellLimits.max_heap_size_bytes` is None (docs/limits.md)."""
DEFAULT_PENDING_OUTPUT_BYTES = 16 << 20
"""A cell's undelivered output when `CellLimits.max_pending_output_bytes` is None."""
MAX_PENDING_OUTPUT_BYTES = 60 << 20
"""The highest pending output limit: all of it fits in one response frame."""
DEFAULT_STORED_VALUE_BYTES = 16 << 20
"""A session's stored values when `CellLimits.max_stored_value_bytes` is None."""


class CellLimits(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    """Limits shared by every cell of a session (docs/limits.md). `None` means the documented
    default, never unbounded where that could take the host down; for `max_cpu_time_ms`,
    `max_wall_time_ms` and the session budgets it means no limit.

    On the wire a field is sent only when set (`omit_defaults`): a host that predates a field
    decodes the limits of a client that leaves it unset; a client sends a set one only to a host
    that advertised its capability (`max_wall_time_ms`: `wall-time-limit`; the session budgets:
    `session-budget`).

    Parameters:
        max_yield_time_ms: the longest observation window (execute and wait alike).
        max_heap_size_bytes: the most each cell's JavaScript heap may hold (default
            `DEFAULT_HEAP_SIZE_BYTES`); the allocation past it fails the cell.
        max_cpu_time_ms: CPU time each cell may use; past it the cell ends by itself with
            `exec cell exceeded its CPU time limit of N ms`, its stored values uncommitted.
        max_pending_output_bytes: output a cell may hold undelivered (default
            `DEFAULT_PENDING_OUTPUT_BYTES`, at most `MAX_PENDING_OUTPUT_BYTES`); past it
            `text()` and `image()` throw a catchable `Error`.
        max_stored_value_bytes: what the session's stored values may take, keys and JSON
            texts (default `DEFAULT_STORED_VALUE_BYTES`); past it `store()` throws.
        max_wall_time_ms: wall-clock time each cell may run, from its admission; past it the
            cell ends by itself as `Completed` with `exec cell exceeded its time limit of N ms`
            (its output kept, its tool calls cancelled, its stored values uncommitted).
        max_session_tool_calls: tool calls all the session's cells together may make; past
            it a tool call's promise rejects with `session tool call budget of N calls is used
            up` (a session-wide budget, as `max_stored_value_bytes` is session-wide).
        max_session_cpu_time_ms: CPU time all the session's cells together may use; once it
            is used up, the session's executes are refused with `AdmissionError` `session CPU
            budget of N ms is used up`.
    """

    max_yield_time_ms: int | None = None
    max_heap_size_bytes: int | None = None
    max_cpu_time_ms: int | None = None
    max_pending_output_bytes: int | None = None
    max_stored_value_bytes: int | None = None
    max_wall_time_ms: int | None = None
    max_session_tool_calls: int | None = None
    max_session_cpu_time_ms: int | None = None

    def problem(self) -> str | None:
        """What makes these limits invalid, or None if they are valid."""
        if self.max_yield_time_ms is not None and self.max_yield_time_ms < 0:
            return f"max_yield_time_ms must not be negative, got {self.max_yield_time_ms}"
        for name in (
            "max_heap_size_bytes",
            "max_cpu_time_ms",
            "max_stored_value_bytes",
            "max_wall_time_ms",
            "max_session_tool_calls",
            "max_session_cpu_time_ms",
        ):
            value = getattr(self, name)
            if value is not None and value <= 0:
                return f"{name} must be positive, got {value}"
        output = self.max_pending_output_bytes
        if output is not None and not 0 < output <= MAX_PENDING_OUTPUT_BYTES:
            return (
                f"max_pending_output_bytes must be between 1 and {MAX_PENDING_OUTPUT_BYTES},"
                f" got {output}"
            )
        return None

    def heap_size_bytes(self) -> int:
        """The heap limit in force: the given one, or the default."""
        return self.max_heap_size_bytes or DEFAULT_HEAP_SIZE_BYTES

    def pending_output_bytes(self) -> int:
        """The pending output limit in force: the given one, or the default."""
        return self.max_pending_output_bytes or DEFAULT_PENDING_OUTPUT_BYTES

    def stored_value_bytes(self) -> int:
        """The stored values limit in force: the given one, or the default."""
        return self.max_stored_value_bytes or DEFAULT_STORED_VALUE_BYTES

    @property
    def has_session_budget(self) -> bool:
        """A session budget is set (it needs the `session-budget` capability on the wire)."""
        return self.max_session_tool_calls is not None or self.max_session_cpu_time_ms is not None

    def checked(self) -> CellLimits:
        """These limits, if they are valid (every provider and the host check them so).

        Raises:
            InvalidRequestError: `invalid code-mode session execution limits: <problem>`.
        """
        problem = self.problem()
        if problem is not None:
            raise InvalidRequestError(f"invalid code-mode session execution limits: {problem}")
        return self


class AdmissionLimits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How much work one host connection (or one in-process provider) takes at once; past a
    bound the work is refused with an `AdmissionError` (`docs/limits.md`).

    Parameters:
        max_requests_in_flight: requests a host connection serves at once (a wire notion:
            the in-process provider has none).
        max_active_cells: cells running, draining or terminating at once, every session
            together; a completed cell whose result nobody collected holds no slot.
        max_pending_delegate_calls: tool calls and notifications in flight at once; a call
            past it rejects its JavaScript promise at once and never reaches the delegate.
        max_uncollected_results: completed cells of one session whose result nobody
            collected; past it, that session's executes are refused until one is collected.
    """

    max_requests_in_flight: int = 256
    max_active_cells: int = 128
    max_pending_delegate_calls: int = 1024
    max_uncollected_results: int = 64

    def __post_init__(self) -> None:
        for name in self.__struct_fields__:
            if getattr(self, name) < 1:
                raise InvalidRequestError(
                    f"invalid code-mode admission limits: {name} must be at least 1"
                )


class ToolThreadLimits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The threads a provider runs plain (sync) tools in (`docs/limits.md`).

    Parameters:
        max_running: sync tool calls running at once; more wait for a thread. These threads
            are the provider's own, apart from trio's default thread limiter (which the
            application, DNS lookups and image preparation use).
        max_abandoned: threads of cancelled calls (their cell ended) that still run, because
            Python cannot stop a thread. They give their place back to live calls at once,
            but while this many still run, a new sync tool call fails at once with
            `tool <name> was not run: <N> threads of cancelled tool calls are still running
            (the limit is <N>)` instead of waiting.
    """

    max_running: int = 40
    max_abandoned: int = 64

    def __post_init__(self) -> None:
        for name in self.__struct_fields__:
            if getattr(self, name) < 1:
                raise InvalidRequestError(
                    f"invalid code-mode tool thread limits: {name} must be at least 1"
                )


class ToolThreadStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """What a provider's sync tool threads hold now (`provider.tool_thread_statistics()`).

    Parameters:
        running: sync tool calls running in a thread.
        waiting: sync tool calls waiting for a thread.
        abandoned: threads of cancelled calls that still run.
        limits: the provider's `ToolThreadLimits`.
    """

    running: int
    waiting: int
    abandoned: int
    limits: ToolThreadLimits


class CellInfo(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    """One live cell of a session, as `Session.cells()` reports it (for capacity).

    Parameters:
        cell_id: its id, as the session's other operations take it.
        phase: its lifecycle state (`codemode_host.runtime.LIFECYCLE`): `running`,
            `draining notifications`, `completed` (its result waits to be collected),
            `completed, claimed`, `terminating` or `terminated`.
        age_s: seconds since it was admitted.
        pending_tool_calls: its tool calls not answered yet.
        buffered_output_bytes: the size of its output no observation took yet.
        cpu_time_ms: the CPU time its JavaScript used so far, as the engine reports it.
        waiting_for_approval: its tool calls (`tool-N`) waiting for the application's
            approval now (docs/governance.md); sent only when not empty.
    """

    cell_id: str
    phase: str
    age_s: float
    pending_tool_calls: int
    buffered_output_bytes: int
    cpu_time_ms: float
    waiting_for_approval: list[str] = msgspec.field(default_factory=list)


class SessionUsage(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a session's cells have used of its budgets, as `Session.usage()` reports it
    (docs/governance.md, "Deadlines and budgets"); counted whether or not a budget is set.

    Parameters:
        tool_calls: tool calls its cells made that reached their tool (a call refused by the
            budget or by admission is not counted).
        cpu_time_ms: the CPU time its cells used, every cell since the session opened: a
            running cell's as of the end of its last turn, an ended cell's in full.
    """

    tool_calls: int
    cpu_time_ms: float
