"""`codemode run`: one JavaScript file as one cell, printed the way the model sees it.

The command plays a model that calls `exec` once and then `wait` until the cell is done; the
model layer (`CodeMode`) formats every response, this module only writes them out.

Rules:
1. Each response is written item by item, each item ending with a line break (the header item
   has its own), an image as `[image <mime>, <n> bytes]`, a blank line between responses.
2. The `--yield-time-ms` and `--max-tokens` options go into the exec pragma (over the file's
   own pragma values) and into every `wait`. A `wait` that sees no new output keeps watching
   for `QUIET_WAIT_MS` in all, so a 0 ms window gives a response per output, not a busy loop.
3. Ctrl-C (SIGINT) terminates the cell (even during `exec`, before its id reached us: the
   session wrapper saw it), prints the `terminate` response and ends with status 130; SIGTERM
   (`kill`, `timeout`) does the same and ends with status 3, the cell's terminated status. A
   response the interrupted call returned meanwhile is dropped, so only one is printed.
4. The clean-up (terminating the cell, closing the provider) is bounded: `EXIT_TIMEOUT`
   seconds after the cell ended or the first signal came, the process exits anyway; a second
   signal, or one during the clean-up, exits at once (130 for SIGINT, 3 for SIGTERM). After the
   run, `trio.run`'s own wait for delegate calls the provider abandoned is bounded by
   `ABANDONED_CALLS_WAIT` (`start_exit_watchdog`).
5. Standard output closed early (`| head -1`): the cell is terminated, nothing more is
   printed, no traceback, and the status is `OUTPUT_CLOSED` (141).
6. On a terminal, standard error shows the elapsed time and the counts so far, cleared before
   anything else is written; on a pipe it shows nothing of the kind.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator
from typing import Any, NoReturn, TextIO

import msgspec
import trio

from ._api import (
    CellId,
    CellInfo,
    Completed,
    ContentItem,
    ExecuteRequest,
    InputImage,
    InputText,
    JsonValue,
    NestedToolCall,
    Pending,
    Session,
    SessionDelegate,
    SessionUsage,
    StartedCell,
    Terminated,
    ToolDefinition,
    WaitOutcome,
    WaitRequest,
)
from ._cli_approval import CliPolicy, default_mode, terminal_approver
from ._cli_interrupts import EarlyInterrupts
from ._combine import CombinedTools, combine
from .errors import ToolError
from .model import CodeMode, PragmaError, ToolOutput, parse_exec_source
from .model._images import decode_data_url

CALL_ID = "call-1"
EXIT_STATUS = {"completed": 0, "failed": 1, "error": 1, "terminated": 3}
INTERRUPTED = 130
OUTPUT_CLOSED = 141
"""The status when standard output was closed early (`| head -1`): what a shell shows for a
program killed by SIGPIPE (128 + 13), as `yes | head -1` gives."""

EXIT_TIMEOUT = 5.0
"""Seconds the command's clean-up may take once the cell has ended or the first Ctrl-C came."""

QUIET_WAIT_MS = 1_000
"""How long a `wait` that sees no new output keeps watching the running cell (`CodeMode`'s
`max_empty_wait_ms`): `--yield-time-ms 0` gives a response per output, not a busy loop."""
_CLEAR_LINE = "\r\x1b[K"


class RunOptions(msgspec.Struct, frozen=True, kw_only=True):
    """The options of `codemode run`.

    Parameters:
        yield_time_ms: the observation window of exec and each wait, or None (the file's).
        max_tokens: the token budget of each response, or None (the file's).
        in_process: run the cell in this process rather than in a host process.
        approve: `ask`, `allow` or `deny` for the calls that need approval (None: `ask` on a
            terminal, else `deny`; `_cli_approval.py`).
        allow, deny: patterns of tool names decided for any tool.
    """

    yield_time_ms: int | None = None
    max_tokens: int | None = None
    in_process: bool = False
    approve: str | None = None
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()


def exec_input(source: str, options: RunOptions) -> tuple[str, dict[str, Any]]:
    """The text handed to `exec` and the arguments of each `wait` besides `cell_id`."""
    try:
        parsed = parse_exec_source(source)
    except PragmaError:
        return source, {}  # exec reports it, as the model would see it
    yield_time_ms = options.yield_time_ms
    if yield_time_ms is None:
        yield_time_ms = parsed.yield_time_ms
    max_tokens = parsed.max_output_tokens if options.max_tokens is None else options.max_tokens
    if options.yield_time_ms is not None or options.max_tokens is not None:
        pragma = {"yield_time_ms": yield_time_ms, "max_output_tokens": max_tokens}
        source = f"// @exec: {json.dumps(pragma)}\n{parsed.code}"
    wait = {"yield_time_ms": yield_time_ms, "max_tokens": max_tokens}
    return source, {key: value for key, value in wait.items() if value is not None}


def render_item(item: ContentItem) -> str:
    """One item as the command prints it (without its closing line break)."""
    if isinstance(item, InputText):
        return item.text.removesuffix("\n")
    return _image_label(item)


def _image_label(item: InputImage) -> str:
    # The model layer has replaced images it could not decode by a text item already.
    mime = item.image_url.removeprefix("data:").partition(",")[0].split(";")[0] or "unknown"
    data = decode_data_url(item.image_url)
    return f"[image {mime}, {'?' if data is None else len(data)} bytes]"


class _Progress:
    """The elapsed time and the counts so far, on one line of a terminal's standard error."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._started = trio.current_time()
        self.responses = 0
        self.items = 0

    async def run(self) -> NoReturn:
        while True:
            elapsed = trio.current_time() - self._started
            self._stream.write(
                f"{_CLEAR_LINE}codemode: running for {elapsed:.1f} s; responses: "
                f"{self.responses}, output items: {self.items}"
            )
            self._stream.flush()
            await trio.sleep(0.1)  # a refresh rate for eyes, not a synchronisation

    def clear(self) -> None:
        self._stream.write(_CLEAR_LINE)
        self._stream.flush()


class _Printer:
    """Writes responses to standard output and notifications to standard error."""

    def __init__(self, out: TextIO, err: TextIO, progress: _Progress | None) -> None:
        self._out = out
        self._err = err
        self._progress = progress
        self._responses = 0
        self._closed = False

    def response(self, output: ToolOutput) -> bool:
        """Write `output`; False when standard output is closed (its reader left)."""
        if self._progress is not None:
            self._progress.clear()
            self._progress.responses += 1
            self._progress.items += len(output.items) - 1  # the header is not output
        if self._closed:
            return False
        try:
            if self._responses:
                self._out.write("\n")
            self._responses += 1
            self._out.writelines(render_item(item) + "\n" for item in output.items)
            self._out.flush()
        except BrokenPipeError:
            self._closed = True
            self._discard_output()
            return False
        return True

    def _discard_output(self) -> None:
        # What is still buffered would fail again when Python flushes the stream at exit
        # ("Exception ignored ... BrokenPipeError"); the null device takes it instead, as the
        # signal module's documentation advises for SIGPIPE.
        with contextlib.suppress(OSError, ValueError):
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._out.fileno())
            os.close(null)

    def error(self, text: str) -> None:
        if self._progress is not None:
            self._progress.clear()
        self._err.write(f"codemode: {text}\n")
        self._err.flush()


class _NotificationPrinter:
    """A tool source without tools that shows the cell's `notify()` texts on standard error."""

    def __init__(self, printer: _Printer) -> None:
        self._printer = printer

    def definitions(self) -> list[ToolDefinition]:
        return []

    async def invoke_tool(self, call: NestedToolCall) -> JsonValue:
        raise ToolError(f"tool {call.tool_name.name} is not served here")  # has no tools

    async def notify(self, call_id: str, cell_id: CellId, text: str) -> None:
        self._printer.error(f"notify: {text}")

    def cell_closed(self, cell_id: CellId) -> None:
        pass


class _CellIdRecorder:
    """The session `CodeMode` drives, remembering the id of the cell it starts.

    Ctrl-C during `exec` must terminate the cell before `exec` has returned its id.
    """

    def __init__(self, session: Session) -> None:
        self._session = session
        self.cell_id: CellId | None = None

    @property
    def is_alive(self) -> bool:
        return self._session.is_alive

    async def execute(
        self,
        request: ExecuteRequest,
        delegate: SessionDelegate,
        *,
        observe_initial: bool = True,
        idempotency_key: str | None = None,
    ) -> StartedCell:
        started = await self._session.execute(
            request, delegate, observe_initial=observe_initial, idempotency_key=idempotency_key
        )
        self.cell_id = started.cell_id
        return started

    async def wait(
        self, request: WaitRequest, *, idempotency_key: str | None = None
    ) -> WaitOutcome:
        return await self._session.wait(request, idempotency_key=idempotency_key)

    async def terminate(
        self, cell_id: CellId, *, idempotency_key: str | None = None
    ) -> WaitOutcome:
        return await self._session.terminate(cell_id, idempotency_key=idempotency_key)

    async def shutdown(self) -> None:
        await self._session.shutdown()

    async def execute_to_pending(
        self,
        request: ExecuteRequest,
        delegate: SessionDelegate,
        *,
        idempotency_key: str | None = None,
    ) -> Pending | Completed | Terminated:
        return await self._session.execute_to_pending(
            request, delegate, idempotency_key=idempotency_key
        )

    async def wait_to_pending(
        self, cell_id: CellId, *, idempotency_key: str | None = None
    ) -> WaitOutcome:
        return await self._session.wait_to_pending(cell_id, idempotency_key=idempotency_key)

    async def preempt(self, cell_id: CellId) -> None:
        await self._session.preempt(cell_id)

    async def cells(self) -> list[CellInfo]:
        return await self._session.cells()

    async def usage(self) -> SessionUsage:
        return await self._session.usage()


class _Run:
    """One `codemode run`: the exec and wait calls, the signals, and the bound of the exit."""

    def __init__(self, printer: _Printer) -> None:
        self._printer = printer
        self._code_mode: CodeMode | None = None
        self._session: _CellIdRecorder | None = None
        self.work = trio.CancelScope()  # the provider's block, cancelled by the first signal
        self._interrupted = False
        self._ending = trio.Event()  # the cell ended or a signal came: the exit bound runs
        self.status = INTERRUPTED  # set when the calls end, or by the signal that ends them

    def attach(self, code_mode: CodeMode, session: _CellIdRecorder) -> None:
        self._code_mode = code_mode
        self._session = session

    def ended(self) -> None:
        """The calls are over: what is left is the clean-up, which `bound_exit` bounds."""
        self._ending.set()

    async def to_end(self, code_mode: CodeMode, text: str, wait_arguments: dict[str, Any]) -> None:
        output = await code_mode.exec(CALL_ID, text)
        while not self._interrupted:
            if not self._printer.response(output):
                self.status = OUTPUT_CLOSED
                return
            if output.status != "running":
                self.status = EXIT_STATUS[output.status]
                return
            output = await code_mode.wait({"cell_id": output.cell_id, **wait_arguments})
        await trio.sleep_forever()  # interrupted: the terminate response is printed instead

    async def watch_signals(self, signals: AsyncIterator[int], nursery: trio.Nursery) -> None:
        async for signum in signals:
            status = INTERRUPTED if signum == signal.SIGINT else EXIT_STATUS["terminated"]
            if self._ending.is_set():
                self._printer.error("interrupted again: exiting without cleaning up")
                exit_now(status)
            self._interrupted = True
            self.status = status
            self._ending.set()
            nursery.start_soon(self._terminate)

    async def _terminate(self) -> None:
        cell_id = None if self._session is None else self._session.cell_id
        if self._code_mode is None or cell_id is None:
            self._printer.error("interrupted before the cell started")
        else:
            terminated = await self._code_mode.wait({"cell_id": cell_id, "terminate": True})
            self._printer.response(terminated)
        self.work.cancel()

    async def bound_exit(self) -> None:
        await self._ending.wait()
        await trio.sleep(EXIT_TIMEOUT)  # a deadline, not a synchronisation
        self._printer.error(
            f"the clean-up did not end within {EXIT_TIMEOUT:g} s (a tool that ignores "
            "cancellation?): exiting without it"
        )
        exit_now(self.status)


def exit_now(status: int) -> NoReturn:
    """End the process at once with `status`, after writing out what was printed.

    The clean-up left undone ends with the process: the host process watches for its parent's
    exit, and tool threads do not outlive it.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(status)


ABANDONED_CALLS_WAIT = 1.0
"""Seconds the process waits, after the run, for the delegate calls its provider abandoned."""


def start_exit_watchdog(status: int) -> threading.Timer:
    """A timer that ends the process with `status` unless cancelled within
    `ABANDONED_CALLS_WAIT` seconds: the run is over, but `trio.run` waits for every task, and a
    delegate call abandoned because it ignores cancellation returns when its thread does."""
    watchdog = threading.Timer(ABANDONED_CALLS_WAIT, exit_now, args=(status,))
    watchdog.daemon = True
    watchdog.start()
    return watchdog


async def run_file(
    source: str,
    tools: CombinedTools,
    options: RunOptions,
    out: TextIO,
    err: TextIO,
    *,
    interrupts: EarlyInterrupts | None = None,
) -> int:
    """Run `source` as one cell with `tools` and print what the model would see.

    `interrupts` holds the Ctrl-Cs noted since the command handed SIGINT over to this run
    (`_cli_interrupts.py`): one is taken as soon as the run's signal receiver is in place.

    Returns:
        The exit status: 0 completed, 1 failed, 3 terminated (SIGTERM included), 130
        interrupted (SIGINT), 141 standard output closed early.

    Within `EXIT_TIMEOUT` seconds of the cell's end or of the first signal, the process has
    exited: a clean-up still going on then (a tool that ignores cancellation) is cut short by
    `exit_now`, as is everything by a second signal.
    """
    from . import open_in_process_provider, open_process_provider

    text, wait_arguments = exec_input(source, options)
    progress = _Progress(err) if err.isatty() else None
    printer = _Printer(out, err, progress)
    delegate = combine(tools, _NotificationPrinter(printer))
    open_provider = open_in_process_provider if options.in_process else open_process_provider
    run = _Run(printer)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        if interrupts is not None:
            interrupts.redeliver()
        async with trio.open_nursery() as watchers:
            watchers.start_soon(run.watch_signals, signals, watchers)
            watchers.start_soon(run.bound_exit)
            with run.work:
                async with open_provider() as provider:
                    session = _CellIdRecorder(await provider.create_session())
                    definitions = tools.definitions()
                    mode = options.approve or default_mode(sys.stdin)
                    code_mode = CodeMode(
                        session,
                        delegate,
                        definitions,
                        max_empty_wait_ms=QUIET_WAIT_MS,
                        policy=CliPolicy(mode, options.allow, options.deny, tools, definitions),
                        approver=terminal_approver() if mode == "ask" else None,
                    )
                    run.attach(code_mode, session)
                    try:
                        async with trio.open_nursery() as nursery:
                            if progress is not None:
                                nursery.start_soon(progress.run)
                            await run.to_end(code_mode, text, wait_arguments)
                            nursery.cancel_scope.cancel()
                    finally:
                        run.ended()
            if progress is not None:
                progress.clear()
            watchers.cancel_scope.cancel()
    return run.status
