"""The thin host: the least a host process built on codemode's engine can do, as a floor.

It is `codemode-host` without codemode: trio, msgspec and the bare engine
(`codemode_host.engine`), and none of the layers a real host adds (the wire's sans-IO
connection, requests, sessions, the runtime's cells and their state, observations, limits,
admission). Each cell is run by a task of its own; every tool call is answered `{}` by the
parent, in its reader, without a task. So what it costs beside the pipe's ping-pong is what any
host that runs cells on this engine pays at least, and what the process provider costs beyond
it is what codemode's layers add (`_thin.py` is the parent's side).

Frames on stdin and stdout: a 4-byte little-endian length, then a msgpack array
`[kind, cell, body]`:
- parent -> host: `[EXECUTE, cell, source]` starts a cell with one tool, `echo`;
  `[ANSWER, cell, call_id]` settles that call with `{}`;
- host -> parent: `[CALL, cell, call_id]`, a tool call; `[DONE, cell, texts]` once the cell
  finished (`texts`: what it printed, a list; a string: the error of a cell that failed).

Run: `python -m benchmarks._thin_host` (from the repository's root); it exits at end of input.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from typing import Any

import msgspec
import trio
from codemode_host.engine import (
    CellTool,
    EngineCell,
    Finished,
    Outcome,
    TextOutput,
    ToolCallRequested,
    open_engine,
)

EXECUTE, ANSWER = 0, 1
"""Kinds of the parent's frames."""
CALL, DONE = 0, 1
"""Kinds of the host's frames."""
PREFIX = struct.Struct("<I")
READ_CHUNK = 1 << 20
TOOLS = [CellTool("echo")]

Message = tuple[int, int, Any]


class FrameWriter:
    """Frames queued by any task, written by one task: all that is queued in one write."""

    def __init__(self, stream: trio.abc.SendStream) -> None:
        self._stream = stream
        self._queued = bytearray()
        self._wake = trio.Event()
        self._encoder = msgspec.msgpack.Encoder()

    def send(self, message: Message) -> None:
        payload = self._encoder.encode(message)
        self._queued += PREFIX.pack(len(payload))
        self._queued += payload
        self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            data, self._queued = self._queued, bytearray()
            await self._stream.send_all(data)


async def read_frames(stream: trio.abc.ReceiveStream, handle: Callable[[Message], None]) -> None:
    """Decode every frame `stream` brings and hand it to `handle`, until end of input."""
    decoder = msgspec.msgpack.Decoder(Message)
    buffer = bytearray()
    while chunk := await stream.receive_some(READ_CHUNK):
        buffer += chunk
        start = 0
        while len(buffer) - start >= PREFIX.size:
            (length,) = PREFIX.unpack_from(buffer, start)
            end = start + PREFIX.size + length
            if end > len(buffer):
                break
            handle(decoder.decode(memoryview(buffer)[start + PREFIX.size : end]))
            start = end
        del buffer[:start]


async def _run_cell(key: int, cell: EngineCell, writer: FrameWriter) -> None:
    texts: list[str] = []
    with cell:
        while True:
            for event in await cell.next_events():
                if isinstance(event, TextOutput):
                    texts.append(event.text)
                elif isinstance(event, ToolCallRequested):
                    writer.send((CALL, key, event.call_id))
                elif isinstance(event, Finished):
                    failed = f"{event.outcome}: {event.error_text}"
                    writer.send((DONE, key, texts if event.outcome is Outcome.OK else failed))
                    return


async def serve() -> None:
    receive = trio.lowlevel.FdStream(os.dup(0))
    writer = FrameWriter(trio.lowlevel.FdStream(os.dup(1)))
    cells: dict[int, EngineCell] = {}
    async with open_engine() as engine, trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)

        async def run(key: int, cell: EngineCell) -> None:
            try:
                await _run_cell(key, cell, writer)
            finally:
                del cells[key]

        def handle(message: Message) -> None:
            kind, key, body = message
            if kind == EXECUTE:
                cells[key] = cell = engine.start_cell(body, tools=TOOLS)
                nursery.start_soon(run, key, cell)
            else:
                cells[key].settle_tool_call(body, b"{}")

        await read_frames(receive, handle)
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    trio.run(serve)
