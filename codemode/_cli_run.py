"""`codemode run`: one JavaScript file as one cell, printed the way the model sees it.

The command plays a model that calls `exec` once and then `wait` until the cell is done; the
model layer (`CodeMode`) formats every response, this module only writes them out.

Rules:
1. Each response is written item by item, each item ending with a line break (the header item
   has its own), an image as `[image <mime>, <n> bytes]`, a blank line between responses.
2. The `--yield-time-ms` and `--max-tokens` options go into the exec pragma (over the file's
   own pragma values) and into every `wait`.
3. Ctrl-C (SIGINT) terminates the cell (even during `exec`, before its id reached us: the
   session wrapper saw it), prints the `terminate` response and ends with status 130; SIGTERM
   (`kill`, `timeout`) does the same and ends with status 3, the cell's terminated status. A
   response the interrupted call returned meanwhile is dropped, so only one is printed.
4. On a terminal, standard error shows the elapsed time and the counts so far, cleared before
   anything else is written; on a pipe it shows nothing of the kind.
"""

from __future__ import annotations

import json
import signal
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
    StartedCell,
    Terminated,
    ToolDefinition,
    WaitOutcome,
    WaitRequest,
)
from ._combine import CombinedTools, combine
from .errors import ToolError
from .model import CodeMode, PragmaError, ToolOutput, parse_exec_source
from .model._images import decode_data_url

CALL_ID = "call-1"
EXIT_STATUS = {"completed": 0, "failed": 1, "error": 1, "terminated": 3}
INTERRUPTED = 130
_CLEAR_LINE = "\r\x1b[K"


class RunOptions(msgspec.Struct, frozen=True, kw_only=True):
    """The options of `codemode run`.

    Parameters:
        yield_time_ms: the observation window of exec and each wait, or None (the file's).
        max_tokens: the token budget of each response, or None (the file's).
        in_process: run the cell in this process rather than in a host process.
    """

    yield_time_ms: int | None = None
    max_tokens: int | None = None
    in_process: bool = False


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

    def response(self, output: ToolOutput) -> None:
        if self._progress is not None:
            self._progress.clear()
            self._progress.responses += 1
            self._progress.items += len(output.items) - 1  # the header is not output
        if self._responses:
            self._out.write("\n")
        self._responses += 1
        self._out.writelines(render_item(item) + "\n" for item in output.items)
        self._out.flush()

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

    async def execute(self, request: ExecuteRequest, delegate: SessionDelegate) -> StartedCell:
        started = await self._session.execute(request, delegate)
        self.cell_id = started.cell_id
        return started

    async def wait(self, request: WaitRequest) -> WaitOutcome:
        return await self._session.wait(request)

    async def terminate(self, cell_id: CellId) -> WaitOutcome:
        return await self._session.terminate(cell_id)

    async def shutdown(self) -> None:
        await self._session.shutdown()

    async def execute_to_pending(
        self, request: ExecuteRequest, delegate: SessionDelegate
    ) -> Pending | Completed | Terminated:
        return await self._session.execute_to_pending(request, delegate)

    async def wait_to_pending(self, cell_id: CellId) -> WaitOutcome:
        return await self._session.wait_to_pending(cell_id)

    async def preempt(self, cell_id: CellId) -> None:
        await self._session.preempt(cell_id)

    async def cells(self) -> list[CellInfo]:
        return await self._session.cells()


class _Run:
    """One `codemode run`: the exec and wait calls, and Ctrl-C."""

    def __init__(self, code_mode: CodeMode, session: _CellIdRecorder, printer: _Printer) -> None:
        self._code_mode = code_mode
        self._session = session
        self._printer = printer
        self._calls = trio.CancelScope()
        self._interrupted = False
        self.status = INTERRUPTED  # set when the calls end, or by the signal that ends them

    async def to_end(self, text: str, wait_arguments: dict[str, Any]) -> None:
        with self._calls:
            output = await self._code_mode.exec(CALL_ID, text)
            while not self._interrupted:
                self._printer.response(output)
                if output.status != "running":
                    self.status = EXIT_STATUS[output.status]
                    return
                output = await self._code_mode.wait({"cell_id": output.cell_id, **wait_arguments})
            await trio.sleep_forever()  # interrupted: the terminate response is printed instead

    async def watch_signals(self, signals: AsyncIterator[int]) -> None:
        async for signum in signals:
            self._interrupted = True
            self.status = INTERRUPTED if signum == signal.SIGINT else EXIT_STATUS["terminated"]
            cell_id = self._session.cell_id
            if cell_id is None:
                self._printer.error("interrupted before the cell started")
            else:
                terminated = await self._code_mode.wait({"cell_id": cell_id, "terminate": True})
                self._printer.response(terminated)
            self._calls.cancel()
            return


async def run_file(
    source: str, tools: CombinedTools, options: RunOptions, out: TextIO, err: TextIO
) -> int:
    """Run `source` as one cell with `tools` and print what the model would see.

    Returns:
        The exit status: 0 completed, 1 failed, 3 terminated (SIGTERM included), 130
        interrupted (SIGINT).
    """
    from . import open_in_process_provider, open_process_provider

    text, wait_arguments = exec_input(source, options)
    progress = _Progress(err) if err.isatty() else None
    printer = _Printer(out, err, progress)
    delegate = combine(tools, _NotificationPrinter(printer))
    open_provider = open_in_process_provider if options.in_process else open_process_provider
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with open_provider() as provider:
            session = _CellIdRecorder(await provider.create_session())
            code_mode = CodeMode(session, delegate, tools.definitions())
            run = _Run(code_mode, session, printer)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run.watch_signals, signals)
                if progress is not None:
                    nursery.start_soon(progress.run)
                await run.to_end(text, wait_arguments)
                nursery.cancel_scope.cancel()
            if progress is not None:
                progress.clear()
    return run.status
