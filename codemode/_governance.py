"""Governed nested calls: a policy consulted before every call a cell makes, approvals, hooks,
and a journal of which calls ran (`docs/governance.md`).

`governed(delegate, ...)` wraps any `SessionDelegate` (a `Toolbox`, an MCP toolbox, a
`combine`d one, the application's own) in `GovernedTools`, a delegate that asks its
`ToolPolicy` about each call before the call reaches the wrapped delegate. `CodeMode` wraps its
delegate this way unless it is governed already.

Rules:
1. The policy's decision comes first: `Allow` runs the call; `Deny(reason)` rejects the cell's
   promise with exactly `tool tools.<identifier> was denied: <reason>` and the tool never runs;
   `Ask` hands an `ApprovalRequest` to the approver and waits, while the cell and its other
   calls go on, for `Approve()` or `Deny(reason)`, or for the ask's timeout (its `on_timeout`,
   a denial by default). Without an approver, an ask is a denial (`NO_APPROVER`).
2. The default policy (`DefaultPolicy`) asks for a tool its source marks as needing approval
   (`@toolbox.tool(needs_approval=True)`), and allows the rest: an application that marks
   nothing runs as before, and a marked tool never runs unattended. A `Toolbox` refuses to run a
   marked tool that no `GovernedTools` approved (an application that hands the toolbox to a
   session without `governed`), with the same denial.
3. `before_call` may replace the arguments (the tool gets the copy) or deny; `after_call` sees
   the result or the error and may replace what the cell gets. Both run for every call the
   policy let through, on every route.
4. Each cell's calls are journaled (`journal(cell_id)`): tool, call id, start and end, outcome
   (`completed`, `failed`, `denied`, `cancelled before it started`, `cancelled while running`,
   `unknown: the host was lost while it ran`: the call's cancellation names the host's loss).
   The journal keeps the last `JOURNAL_CELLS` cells and `JOURNAL_CALLS` calls of each.
5. While a call waits for its approver it is listed by `waiting(cell_id)`, and `on_waiting`
   (when set) is called once as it starts waiting: `CodeMode` makes the cell's active
   observation return at once, so the model learns of the wait instead of polling blindly.
6. The runtime learns of the wait too: whoever runs the call (the in-process runtime, or the
   client of a host) puts a reporter in `approval_reporter` for it, called with True as the
   wait begins and False as it ends, so `Session.cells()` lists the call and the cell's
   wall-clock limit pauses while all its calls wait so.
"""

from __future__ import annotations

import collections
import contextvars
import dataclasses
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol, TypeAlias, runtime_checkable

from ._api import CellId, JsonValue, NestedToolCall, SessionDelegate, ToolDefinition, ToolName
from ._identifiers import normalize_identifier
from .errors import HOST_LOST_REASON, ToolDeniedError
from .observability import annotate_current_span

UNKNOWN = "unknown: the host was lost while it ran"
"""The journal's outcome of a call that was running when its host was lost (rule 4)."""
NO_APPROVER = "it needs approval and no approver is configured"
"""The reason a call that needs approval is denied when nobody can approve it."""
JOURNAL_CELLS = 256
JOURNAL_CALLS = 1024


@dataclasses.dataclass(frozen=True)
class Allow:
    """Run the call."""


@dataclasses.dataclass(frozen=True)
class Deny:
    """Do not run the call; the cell's promise rejects naming `reason`."""

    reason: str


@dataclasses.dataclass(frozen=True)
class Ask:
    """Ask the approver; past `timeout_s` seconds (None: no timeout) `on_timeout` decides."""

    timeout_s: float | None = None
    on_timeout: Allow | Deny = Deny("no decision in time")


@dataclasses.dataclass(frozen=True)
class Approve:
    """The approver's yes."""


Decision: TypeAlias = Allow | Deny | Ask
Verdict: TypeAlias = Approve | Deny


@dataclasses.dataclass(frozen=True)
class ApprovalRequest:
    """A call waiting for a decision.

    Parameters:
        tool: the tool's routing name; `identifier`: how the cell calls it (`tools.<identifier>`).
        arguments: the call's JSON input.
        cell_id, call_id: the cell and its call (`tool-N`).
        source: the cell's JavaScript, when the cell was started with `for_source`.
    """

    tool: ToolName
    identifier: str
    arguments: JsonValue
    cell_id: CellId
    call_id: str
    source: str | None = None


Approver: TypeAlias = Callable[[ApprovalRequest], Awaitable[Verdict]]


@runtime_checkable
class MarksApproval(Protocol):
    """A tool source that says which of its tools need approval (`Toolbox` does)."""

    def needs_approval(self, tool: ToolName) -> bool: ...


class ToolPolicy(Protocol):
    """Decides each nested call before it runs (rule 1); `before_call` and `after_call` are
    the hooks of rule 3 (`PolicyBase` has pass-through ones)."""

    async def decide(self, call: NestedToolCall) -> Decision: ...

    async def before_call(self, call: NestedToolCall) -> JsonValue | Deny: ...

    async def after_call(
        self, call: NestedToolCall, result: JsonValue, error: BaseException | None
    ) -> JsonValue: ...


class PolicyBase:
    """A policy that allows everything and changes nothing: subclass it and override."""

    async def decide(self, call: NestedToolCall) -> Decision:
        return Allow()

    async def before_call(self, call: NestedToolCall) -> JsonValue | Deny:
        """The arguments the tool gets (default: the call's), or a denial."""
        return call.input

    async def after_call(
        self, call: NestedToolCall, result: JsonValue, error: BaseException | None
    ) -> JsonValue:
        """What the cell gets: `result` (default), or raise to fail the call (`error` is the
        tool's exception, re-raised after this hook when it returns normally)."""
        return result


class DefaultPolicy(PolicyBase):
    """Asks for the tools the delegate marks as needing approval, allows the rest (rule 2)."""

    def __init__(self, marks: MarksApproval | None = None, timeout_s: float | None = None) -> None:
        self._marks = marks
        self._timeout_s = timeout_s

    async def decide(self, call: NestedToolCall) -> Decision:
        if self._marks is not None and self._marks.needs_approval(call.tool_name):
            return Ask(timeout_s=self._timeout_s)
        return Allow()


@dataclasses.dataclass
class JournalEntry:
    """One nested call of a cell (rule 4); `ended` is None while it runs."""

    tool: str
    call_id: str
    started: float
    ended: float | None = None
    outcome: str = "running"
    decision: str = ""
    """How its policy decided: `allowed`, `denied`, `approved`, `declined`, `denied: no
    approver`, `timed out: approved` or `timed out: declined`."""


approval_reporter: contextvars.ContextVar[Callable[[bool], None] | None] = contextvars.ContextVar(
    "codemode_approval_reporter", default=None
)
"""Rule 6: set by the runner of a call, for the wait of that call."""

approved: contextvars.ContextVar[NestedToolCall | None] = contextvars.ContextVar(
    "codemode_approved_call", default=None
)
"""The call a `GovernedTools` let through, while the wrapped delegate runs it (rule 2)."""


def denial(identifier: str, reason: str) -> ToolDeniedError:
    """The rejection of a denied call (rule 1): an `Error` in the cell."""
    return ToolDeniedError(f"tool tools.{identifier} was denied: {reason}")


class GovernedTools:
    """A delegate whose calls its policy decides first (implements `SessionDelegate`; made by
    `governed`)."""

    def __init__(
        self,
        delegate: SessionDelegate,
        policy: ToolPolicy | None,
        approver: Approver | None,
        definitions: Iterable[ToolDefinition],
    ) -> None:
        self._delegate = delegate
        marks = delegate if isinstance(delegate, MarksApproval) else None
        self._policy: ToolPolicy = policy if policy is not None else DefaultPolicy(marks)
        self._approver = approver
        self._identifiers = {d.tool_name: normalize_identifier(d.name) for d in definitions}
        self._journals: collections.OrderedDict[CellId, list[JournalEntry]] = (
            collections.OrderedDict()
        )
        self._waiting: dict[CellId, list[JournalEntry]] = {}
        self.on_waiting: Callable[[CellId], Awaitable[None]] | None = None
        """Called as a call of the cell starts waiting for approval (rule 5)."""

    @property
    def delegate(self) -> SessionDelegate:
        """The wrapped delegate."""
        return self._delegate

    def definitions(self) -> list[ToolDefinition]:
        """The wrapped delegate's definitions, when it has them."""
        definitions = getattr(self._delegate, "definitions", None)
        return list(definitions()) if callable(definitions) else []

    def waiting(self, cell_id: CellId) -> list[JournalEntry]:
        """The cell's calls waiting for approval now, oldest first (rule 5)."""
        return list(self._waiting.get(cell_id, ()))

    def journal(self, cell_id: CellId) -> list[JournalEntry]:
        """The cell's calls so far, oldest first (rule 4; empty for a cell it never saw)."""
        return list(self._journals.get(cell_id, ()))

    def _entry(self, call: NestedToolCall, identifier: str) -> JournalEntry:
        entries = self._journals.get(call.cell_id)
        if entries is None:
            entries = self._journals[call.cell_id] = []
            while len(self._journals) > JOURNAL_CELLS:
                self._journals.popitem(last=False)
        entry = JournalEntry(
            tool=identifier, call_id=call.runtime_tool_call_id, started=time.time()
        )
        if len(entries) < JOURNAL_CALLS:
            entries.append(entry)
        return entry

    def for_source(self, source: str) -> SessionDelegate:
        """This delegate for one cell whose JavaScript is `source`: its approval requests
        carry the source (pass it to `Session.execute` instead of this delegate)."""
        return _WithSource(self, source)

    async def invoke_tool(self, call: NestedToolCall, source: str | None = None) -> JsonValue:
        identifier = self._identifiers.get(call.tool_name) or normalize_identifier(
            call.tool_name.name
        )
        entry = self._entry(call, identifier)
        started = False
        try:
            verdict = await self._decide(call, identifier, source, entry)
            annotate_current_span("codemode.tool_call.decision", entry.decision)
            if isinstance(verdict, Deny):
                entry.outcome = "denied"
                raise denial(identifier, verdict.reason)
            arguments = await self._policy.before_call(call)
            if isinstance(arguments, Deny):
                entry.outcome = "denied"
                raise denial(identifier, arguments.reason)
            if arguments is not call.input:
                call = _with_input(call, arguments)
            started = True
            token = approved.set(call)
            try:
                result = await self._delegate.invoke_tool(call)
            except BaseException as error:
                if _is_cancellation(error):
                    raise
                await self._policy.after_call(call, None, error)
                raise
            finally:
                approved.reset(token)
            result = await self._policy.after_call(call, result, None)
        except BaseException as error:
            if entry.outcome == "running":
                if _is_cancellation(error):
                    before = "cancelled before it started"
                    entry.outcome = "cancelled while running" if started else before
                    if started and getattr(error, "reason", None) == HOST_LOST_REASON:
                        entry.outcome = UNKNOWN
                else:
                    entry.outcome = "failed"
            raise
        else:
            entry.outcome = "completed"
            return result
        finally:
            entry.ended = time.time()

    async def _decide(
        self, call: NestedToolCall, identifier: str, source: str | None, entry: JournalEntry
    ) -> Verdict | Allow:
        decision = await self._policy.decide(call)
        if not isinstance(decision, Ask):
            entry.decision = "allowed" if isinstance(decision, Allow) else "denied"
            return decision
        if self._approver is None:
            entry.decision = "denied: no approver"
            return Deny(NO_APPROVER)
        request = ApprovalRequest(
            tool=call.tool_name,
            identifier=identifier,
            arguments=call.input,
            cell_id=call.cell_id,
            call_id=call.runtime_tool_call_id,
            source=source,
        )
        import trio  # not at import: `import codemode` does not load trio

        waiting = self._waiting.setdefault(call.cell_id, [])
        waiting.append(entry)
        entry.outcome = "waiting for approval"
        report = approval_reporter.get()
        if report is not None:
            report(True)
        try:
            if self.on_waiting is not None:
                await self.on_waiting(call.cell_id)
            if decision.timeout_s is None:
                verdict = await self._approver(request)
            else:
                with trio.move_on_after(decision.timeout_s):
                    verdict = await self._approver(request)
                    entry.decision = _asked(verdict)
                    return verdict
                entry.decision = "timed out: " + _asked(decision.on_timeout)
                return decision.on_timeout
            entry.decision = _asked(verdict)
            return verdict
        finally:
            if report is not None:
                report(False)
            entry.outcome = "running"
            waiting.remove(entry)
            if not waiting:
                del self._waiting[call.cell_id]

    async def notify(self, call_id: str, cell_id: CellId, text: str) -> None:
        await self._delegate.notify(call_id, cell_id, text)

    def cell_closed(self, cell_id: CellId) -> None:
        self._delegate.cell_closed(cell_id)

    def needs_approval(self, tool: ToolName) -> bool:
        return isinstance(self._delegate, MarksApproval) and self._delegate.needs_approval(tool)


class _WithSource:
    """A `GovernedTools` for one cell whose source its approval requests carry."""

    def __init__(self, governed: GovernedTools, source: str) -> None:
        self._governed = governed
        self._source = source

    async def invoke_tool(self, call: NestedToolCall) -> JsonValue:
        return await self._governed.invoke_tool(call, self._source)

    async def notify(self, call_id: str, cell_id: CellId, text: str) -> None:
        await self._governed.notify(call_id, cell_id, text)

    def cell_closed(self, cell_id: CellId) -> None:
        self._governed.cell_closed(cell_id)


def _asked(verdict: Approve | Allow | Deny) -> str:
    return "declined" if isinstance(verdict, Deny) else "approved"


def _with_input(call: NestedToolCall, arguments: JsonValue) -> NestedToolCall:
    import msgspec

    return msgspec.structs.replace(call, input=arguments)


def _is_cancellation(error: BaseException) -> bool:
    return type(error).__name__ == "Cancelled"


def governed(
    delegate: SessionDelegate,
    *,
    policy: ToolPolicy | None = None,
    approver: Approver | None = None,
    definitions: Iterable[ToolDefinition] | None = None,
) -> GovernedTools:
    """`delegate`, with every nested call decided by `policy` first (`docs/governance.md`).

    Args:
        delegate: the tools (any `SessionDelegate`).
        policy: decides each call (default: `DefaultPolicy`, rule 2).
        approver: answers `Ask` decisions (`async def approver(request) -> Approve | Deny`);
            without one an ask is a denial.
        definitions: the enabled tools, for the names the cell calls them by (default: the
            delegate's own `definitions()`, when it has them).

    `ApprovalRequest.source` holds the cell's JavaScript when the cell was started with
    `for_source(source)` as its delegate (`CodeMode` does so).
    """
    if definitions is None:
        own = getattr(delegate, "definitions", None)
        definitions = own() if callable(own) else []
    return GovernedTools(delegate, policy, approver, definitions)
