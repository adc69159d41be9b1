"""`CodeMode`: the `exec` and `wait` tools of one session, ready to hand to a model.

Rules:
1. `exec` parses the pragma, starts a cell with the augmented tool definitions and formats its
   first response; `wait` observes (or terminates) a cell and formats what it gets. Errors the
   model can act on (a refused pragma, bad arguments, a busy cell, a session shutting down) come
   back as a tool-level error output, never as an exception. The model's strings (the code,
   the call id, a cell id) are made well-formed first (`_arguments` rule 4): a lone surrogate
   becomes U+FFFD before any provider sees it, so the providers cannot differ on it.
2. The wall time runs from the start of the call; the token budget is the pragma's
   `max_output_tokens` for `exec`, the call's own `max_tokens` for `wait`, 10000 otherwise.
3. Cheaper waiting, off unless asked for: `min_yield_time_ms` raises every observation window
   (exec and wait) to a floor; `max_empty_wait_ms` makes a `wait` whose window ends with no new
   output, while the cell still runs, keep observing (in windows of the call's own length, at
   least `MIN_EMPTY_WAIT_WINDOW_MS`) until that many milliseconds have passed since the call
   began; the first output, the completion or the termination ends it as usual.
4. A cancelled `exec` terminates the cell it started, since the model never learned its id:
   shielded, and bounded by `ABANDON_TIMEOUT` seconds.
5. A call the model framework repeats (the same tool call id, the same arguments) gets the
   first call's `ToolOutput` instead of acting again: an `exec` runs one cell, a `wait` observes
   (or terminates) once. The book is `CodeMode`'s own (`_idempotency.IdempotencyBook`), keyed
   by the call id and the arguments together, so a reused id with other arguments is a new
   call. It sits above the session, not in it: a cancelled call has no outcome, so its repeat
   acts anew (a cancelled `exec` terminated its cell, rule 4: the session's key would only
   name that dead cell), and a `wait` that keeps observing an empty cell (rule 3) is one
   outcome, not several.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any, ClassVar

import msgspec
import trio

from .._api import (
    Completed,
    ExecuteRequest,
    InputText,
    Pending,
    RuntimeResponse,
    Session,
    SessionDelegate,
    Terminated,
    ToolDefinition,
    WaitOutcome,
    WaitRequest,
    Yielded,
)
from .._governance import (
    UNKNOWN,
    Approver,
    GovernedTools,
    JournalEntry,
    ToolPolicy,
    governed,
)
from .._idempotency import IdempotencyBook, call_key, content_bytes
from .._limits import MAX_YIELD_TIME_MS
from .._text import well_formed
from ..errors import CodeModeError, HostLostError, RuntimeReplacedError
from ..observability import ModelSpan, model_span
from ._arguments import ArgumentsError, WaitArguments, exec_text, wait_arguments
from ._descriptions import (
    EXEC_TOOL_NAME,
    WAIT_TOOL_NAME,
    NamespaceDescription,
    augment_tool_definition,
)
from ._descriptions import exec_description as _exec_description
from ._descriptions import wait_description as _wait_description
from ._images import has_images, prepare_images
from ._output import DEFAULT_MAX_TOKENS, ToolKindName, ToolOutput, error_output, format_response
from ._pragma import PragmaError, parse_exec_source
from ._specs import ModelApi
from ._specs import tool_specs as _tool_specs
from ._truncation import truncate_items

ABANDON_TIMEOUT = 5.0
"""Seconds a cancelled `exec` waits for the termination of the cell it started."""

DEFAULT_YIELD_TIME_MS = 10_000

MIN_EMPTY_WAIT_WINDOW_MS = 1_000
"""The shortest window in which a `wait` keeps observing a silent cell (`max_empty_wait_ms`),
so that a model's 0 ms window does not turn into a busy loop of observations."""


class CodeMode:
    """The model-facing `exec` and `wait` tools over one session.

    Args:
        session: the session whose cells run the code.
        delegate: runs the nested tools and receives notifications.
        tools: the nested tools the cells may call, in `ALL_TOOLS` order.
        namespace_descriptions: headings of the exec description, keyed by
            `ToolName.namespace`.
        deferred_tools_available: tell the model that some tools may be missing from the
            description (and how to find them in `ALL_TOOLS`).
        min_yield_time_ms: the shortest observation window a model may ask for (None: any).
        max_empty_wait_ms: how long a `wait` keeps observing a running cell that has no new
            output, in total (None: it answers when its window ends).
        policy: decides each nested call (`docs/governance.md`; default `DefaultPolicy`:
            tools marked `needs_approval` are asked for, the rest allowed).
        approver: answers the policy's asks (without one, an ask is a denial).

    The delegate is wrapped in `governed(delegate, policy=..., approver=...)` unless it is a
    `GovernedTools` already (then `policy` and `approver` must not be given).

    Raises:
        ValueError: a `min_yield_time_ms` or `max_empty_wait_ms` below 0 or past
            `MAX_YIELD_TIME_MS`; `policy` or `approver` with a governed delegate.

    Every method may be called concurrently with the others (a model may call tools in
    parallel); `CodeMode` keeps no state between calls but the recent cells' journals and the
    outputs of its recent calls, for the repeats of a call (rule 5).
    """

    tool_names: ClassVar[tuple[str, str]] = (EXEC_TOOL_NAME, WAIT_TOOL_NAME)
    """The names `call` dispatches."""

    def __init__(
        self,
        session: Session,
        delegate: SessionDelegate,
        tools: Iterable[ToolDefinition],
        *,
        namespace_descriptions: Mapping[str, NamespaceDescription] | None = None,
        deferred_tools_available: bool = False,
        min_yield_time_ms: int | None = None,
        max_empty_wait_ms: int | None = None,
        policy: ToolPolicy | None = None,
        approver: Approver | None = None,
    ) -> None:
        for name, value in (
            ("min_yield_time_ms", min_yield_time_ms),
            ("max_empty_wait_ms", max_empty_wait_ms),
        ):
            if value is not None and value < 0:
                raise ValueError(f"{name} must not be negative, got {value}")
            if value is not None and value > MAX_YIELD_TIME_MS:
                raise ValueError(f"{name} must be at most {MAX_YIELD_TIME_MS}, got {value}")
        self._session = session
        self._tools = list(tools)
        if isinstance(delegate, GovernedTools):
            if policy is not None or approver is not None:
                raise ValueError("the delegate is governed already: give it the policy")
            self._governed = delegate
        else:
            self._governed = governed(
                delegate,
                policy=policy,
                approver=approver,
                definitions=self._tools,
            )
        self._delegate: SessionDelegate = self._governed
        self._governed.on_waiting = self._approval_started
        self._enabled = [augment_tool_definition(tool) for tool in self._tools]
        self._namespaces = dict(namespace_descriptions or {})
        self._deferred = deferred_tools_available
        self._min_yield_time_ms = min_yield_time_ms
        self._max_empty_wait_ms = max_empty_wait_ms
        self._calls = IdempotencyBook(measure=_output_bytes)  # rule 5

    async def _approval_started(self, cell_id: str) -> None:
        """A call of the cell waits for approval: its active observation (the initial response
        or a `wait`) returns now, with the waiting line (rule 5 of `_governance`)."""
        try:
            await self._session.preempt(cell_id)
        except CodeModeError:
            pass  # the cell or its session is gone, or the host cannot preempt: nothing to wake

    def journal(self, cell_id: str) -> list[JournalEntry]:
        """The nested calls of a cell this `CodeMode` started, oldest first."""
        return self._governed.journal(cell_id)

    def exec_description(self) -> str:
        """The `exec` tool's description, with the declarations of the nested tools."""
        return _exec_description(
            self._tools,
            namespace_descriptions=self._namespaces,
            deferred_tools_available=self._deferred,
        )

    def wait_description(self) -> str:
        """The `wait` tool's description."""
        return _wait_description()

    def tool_specs(self, api: ModelApi) -> list[dict[str, Any]]:
        """The `exec` and `wait` tool definitions for `"openai"` or `"anthropic"`."""
        return _tool_specs(
            api,
            self._tools,
            namespace_descriptions=self._namespaces,
            deferred_tools_available=self._deferred,
        )

    async def call(self, name: str, call_id: str, payload: Any) -> ToolOutput:
        """Run the model's call of `exec` or `wait`, in either API's shape.

        Args:
            name: `"exec"` or `"wait"`.
            call_id: the model's id of the call (the `call_id` of the cell's notifications);
                a repeat of the call, with the same id and payload, gets the same output
                (rule 5).
            payload: for `exec`, the raw text (OpenAI) or `{"code": text}` (Anthropic); for
                `wait`, the JSON text of the arguments (OpenAI) or the decoded object
                (Anthropic).

        Raises:
            ValueError: `name` is not one of `CodeMode.tool_names`.
        """
        if name == EXEC_TOOL_NAME:
            try:
                text = exec_text(payload)
            except ArgumentsError as error:
                return error_output(str(error), tool="exec")
            return await self.exec(call_id, text)
        if name == WAIT_TOOL_NAME:
            return await self.wait(payload, call_id)
        raise ValueError(f"code mode has no tool named {name!r} (only 'exec' and 'wait')")

    async def exec(self, tool_call_id: str, text: str) -> ToolOutput:
        """Run the model's `exec` call: start a cell and return its first response.

        Args:
            tool_call_id: the model's id of the call; the cell's notifications carry it. A
                repeat with the same id and text gets this call's output, and starts no
                other cell (rule 5; an empty id: every call is new).
            text: the raw JavaScript, optionally with the `// @exec:` pragma line.

        Cancellation: cancelling this call once the cell is started terminates the cell
        (shielded, at most `ABANDON_TIMEOUT` seconds), since no one else knows its id.
        """
        with model_span("code_mode.exec", tool_call_id) as span:
            key = call_key(EXEC_TOOL_NAME, tool_call_id, text) if tool_call_id else None
            output = await self._calls.run(
                key, EXEC_TOOL_NAME, partial(self._exec, tool_call_id, text, span)
            )
            span.set("codemode.output.status", output.status)
            span.set("codemode.cell.id", output.cell_id)
            return output

    async def _exec(self, tool_call_id: str, text: str, span: ModelSpan) -> ToolOutput:
        started_at = trio.current_time()
        tool_call_id = well_formed(tool_call_id)
        try:
            source = parse_exec_source(well_formed(text))
        except PragmaError as error:
            return error_output(str(error), tool="exec")
        span.set("codemode.exec.yield_time_ms", source.yield_time_ms)
        span.set("codemode.exec.max_output_tokens", source.max_output_tokens)
        try:
            # The pragma's bounds are the request's (rule 1): building it raises only if they
            # part, and then the model still gets the text.
            request = ExecuteRequest(
                tool_call_id=tool_call_id,
                source=source.code,
                enabled_tools=self._enabled,
                yield_time_ms=self._window(source.yield_time_ms),
                max_output_tokens=source.max_output_tokens,
            )
            started = await self._session.execute(request, self._governed.for_source(source.code))
        except CodeModeError as error:
            return error_output(str(error), tool="exec")
        try:
            try:
                response = await started.initial_response()
            except CodeModeError as error:
                return self._stopped(error, "exec", started.cell_id)
            return await self._format(response, started_at, source.max_output_tokens, "exec", span)
        except BaseException:
            await self._abandon(started.cell_id)
            raise

    async def wait(self, arguments: Any, tool_call_id: str | None = None) -> ToolOutput:
        """Run the model's `wait` call: observe a cell (or terminate it).

        Args:
            arguments: the call's decoded JSON object (its JSON text is accepted too).
            tool_call_id: the model's id of the call, when the caller has it: a repeat with
                the same id and arguments gets this call's output, and observes nothing more
                (rule 5). None (or empty): every call is new.
        """
        with model_span("code_mode.wait", tool_call_id) as span:
            output = await self._wait(arguments, span, tool_call_id)
            span.set("codemode.output.status", output.status)
            span.set("codemode.cell.id", output.cell_id)
            return output

    async def _wait(self, arguments: Any, span: ModelSpan, tool_call_id: str | None) -> ToolOutput:
        started_at = trio.current_time()
        try:
            parsed = wait_arguments(arguments)
        except ArgumentsError as error:
            return error_output(str(error), tool="wait")
        key = None
        if tool_call_id:
            key = call_key(WAIT_TOOL_NAME, tool_call_id, *map(str, msgspec.structs.astuple(parsed)))
        return await self._calls.run(
            key, WAIT_TOOL_NAME, partial(self._waited, parsed, span, started_at)
        )

    async def _waited(
        self, parsed: WaitArguments, span: ModelSpan, started_at: float
    ) -> ToolOutput:
        span.set("codemode.wait.yield_time_ms", parsed.yield_time_ms)
        span.set("codemode.wait.max_tokens", parsed.max_tokens)
        span.set("codemode.wait.terminate", parsed.terminate)
        try:
            if parsed.terminate:
                outcome = await self._session.terminate(parsed.cell_id)
            else:
                outcome = await self._observe(parsed, started_at)
        except CodeModeError as error:
            return self._stopped(error, "wait", parsed.cell_id)
        response = outcome.response
        assert not isinstance(response, Pending), "only the frontier operations return one"
        return await self._format(response, started_at, parsed.max_tokens, "wait", span)

    def _window(self, yield_time_ms: int | None) -> int | None:
        if self._min_yield_time_ms is None:
            return yield_time_ms
        chosen = DEFAULT_YIELD_TIME_MS if yield_time_ms is None else yield_time_ms
        return max(chosen, self._min_yield_time_ms)

    async def _observe(self, arguments: WaitArguments, started_at: float) -> WaitOutcome:
        window = self._window(arguments.yield_time_ms)
        assert window is not None
        request = WaitRequest(cell_id=arguments.cell_id, yield_time_ms=window)
        outcome = await self._session.wait(request)
        if self._max_empty_wait_ms is None:
            return outcome
        deadline = started_at + self._max_empty_wait_ms / 1000
        step = max(window, MIN_EMPTY_WAIT_WINDOW_MS)
        while isinstance(outcome.response, Yielded) and not outcome.response.content_items:
            remaining_ms = math.ceil((deadline - trio.current_time()) * 1000)
            if remaining_ms <= 0:
                break
            request = WaitRequest(cell_id=arguments.cell_id, yield_time_ms=min(step, remaining_ms))
            outcome = await self._session.wait(request)
        return outcome

    async def _format(
        self,
        response: RuntimeResponse,
        started_at: float,
        max_tokens: int | None,
        tool: ToolKindName,
        span: ModelSpan,
    ) -> ToolOutput:
        items = response.content_items
        if has_images(items):
            items = await trio.to_thread.run_sync(prepare_images, items)
        trailer: list[InputText] = []
        if _stopped_short(response):
            line = journal_line(self._governed.journal(response.cell_id))
            if line is not None:
                trailer.append(InputText(text=line))
        elif isinstance(response, Yielded):
            waiting = self._governed.waiting(response.cell_id)
            if waiting:
                items = [InputText(text=waiting_line(waiting)), *items]
        if span.recording:
            budget = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
            span.set("codemode.output.max_tokens", budget)
            span.set("codemode.output.truncated", truncate_items(list(items), budget) != items)
        return format_response(
            response,
            items,
            wall_time=trio.current_time() - started_at,
            max_tokens=max_tokens,
            tool=tool,
            trailer=trailer,
        )

    def _stopped(self, error: CodeModeError, tool: ToolKindName, cell_id: str) -> ToolOutput:
        """A tool-level error; when the cell's runtime went away, with its calls' journal."""
        text = str(error)
        if isinstance(error, HostLostError | RuntimeReplacedError):
            line = journal_line(self._governed.journal(cell_id))
            if line is not None:
                text = f"{text}\n{line}"
        return error_output(text, tool=tool, cell_id=cell_id)

    async def _abandon(self, cell_id: str) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(ABANDON_TIMEOUT):
            try:
                await self._session.terminate(cell_id)
            except CodeModeError:
                pass  # the cell or its host is gone already: nothing is left to stop


_STOPPED_SHORT = (
    "exec cell exceeded its",  # CPU and wall-time limits
    "InternalError: out of memory",  # the heap limit and the host's heap budget
    "exec runtime ended unexpectedly",
)


def _stopped_short(response: RuntimeResponse) -> bool:
    """The cell did not end by itself: terminated, or cut off by a limit."""
    if isinstance(response, Terminated):
        return True
    return (
        isinstance(response, Completed)
        and response.error_text is not None
        and response.error_text.startswith(_STOPPED_SHORT)
    )


def journal_line(entries: list[JournalEntry]) -> str | None:
    """What the model reads about the calls of a cell that did not end cleanly: those that
    completed or were running, so it knows which effects may have happened before it retries
    (`docs/governance.md`); None when there were none."""
    parts = []
    for entry in entries:
        call = entry.call_id.replace("tool-", "call ")
        if entry.outcome == "completed":
            parts.append(f"tools.{entry.tool} ({call}) completed")
        elif entry.outcome in ("running", "cancelled while running", UNKNOWN):
            parts.append(f"tools.{entry.tool} ({call}) was running and may have taken effect")
        elif entry.outcome == "failed":
            parts.append(f"tools.{entry.tool} ({call}) failed")
    if not parts:
        return None
    return f"Tool calls before the cell stopped: {'; '.join(parts)}."


def waiting_line(waiting: list[JournalEntry]) -> str:
    """The first line of a response while calls of the cell wait for approval
    (`docs/governance.md`)."""
    calls = ", ".join(
        f"tools.{entry.tool} ({entry.call_id.replace('tool-', 'call ')})" for entry in waiting
    )
    return f"Waiting for approval of {calls}."


def _output_bytes(output: object) -> int:
    """What a remembered call's output holds (the book's byte bound, rule 5)."""
    return content_bytes(output.items) if isinstance(output, ToolOutput) else 0
