"""The parent's side of the thin host (`_thin_host.py`): a floor between the pipe's ping-pong
and the process provider.

`open_thin_host()` spawns the thin host and gives a `ThinHost`, whose `run_cell(source)` starts
a cell and returns what it printed once it finished; any number of cells may run at once. The
tool calls of its cells are answered `{}` at once by the reader (timed in `arrivals` while
`record_arrivals` is set), so a cell of sequential calls times the least a nested tool call can
cost through a host on this engine.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from benchmarks._measure import WorkloadError
from benchmarks._thin_host import ANSWER, CALL, EXECUTE, FrameWriter, Message, read_frames
from codemode._trio import open_service_nursery

ROOT = Path(__file__).resolve().parent.parent
LABEL = "thin host (trio, msgspec, bare engine)"
"""How the tables name it."""
CLOSE_SECONDS = 5.0


class _Done:
    """What one cell's `DONE` brings, and the event its caller waits on."""

    __slots__ = ("body", "event")

    def __init__(self) -> None:
        self.body: object = None
        self.event = trio.Event()


class ThinHost:
    """A running thin host: start cells, answer their tool calls."""

    def __init__(self, process: trio.Process, writer: FrameWriter) -> None:
        self.process = process
        self.arrivals: list[float] = []
        self.record_arrivals = False
        self._writer = writer
        self._waiting: dict[int, _Done] = {}
        self._next_key = 0

    async def run_cell(self, source: str) -> list[str]:
        """Start a cell of `source` and return its texts once it finished.

        Raises:
            WorkloadError: the cell failed.
        """
        key = self._next_key
        self._next_key += 1
        done = self._waiting[key] = _Done()
        self._writer.send((EXECUTE, key, source))
        await done.event.wait()
        if not isinstance(done.body, list):
            raise WorkloadError(f"the thin host's cell failed: {done.body}")
        return done.body

    def handle(self, message: Message) -> None:
        kind, key, body = message
        if kind == CALL:
            if self.record_arrivals:
                self.arrivals.append(time.perf_counter())
            self._writer.send((ANSWER, key, body))
        else:
            done = self._waiting.pop(key)
            done.body = body
            done.event.set()


@asynccontextmanager
async def open_thin_host(command: Sequence[str] | None = None) -> AsyncIterator[ThinHost]:
    """The thin host, started with `command` (default: `python -m benchmarks._thin_host`), as
    long as the block runs."""
    process = await trio.lowlevel.open_process(
        list(command or [sys.executable, "-m", "benchmarks._thin_host"]),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=ROOT,
    )
    assert process.stdin is not None
    assert process.stdout is not None
    writer = FrameWriter(process.stdin)
    host = ThinHost(process, writer)
    try:
        async with open_service_nursery() as nursery:
            nursery.start_soon(writer.run)
            nursery.start_soon(read_frames, process.stdout, host.handle)
            try:
                yield host
            finally:
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await process.stdin.aclose()
            with trio.move_on_after(CLOSE_SECONDS):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()
