"""The floors the process provider is measured against: what a trio process and a trivial
trio+msgspec child (`_floor_child.py`) pay to exchange length-prefixed msgpack frames over
pipes, measured in the same run as the figures.

- `ping_pong`: a frame of `request_bytes` out, a frame of `reply_bytes` back, encoded and
  decoded on both sides (the least an execute or a nested tool call can cost);
- `one_way`: one frame carrying a payload to the child, which decodes it and answers a few
  bytes (the least a large tool result can cost);
- `cold_start`: spawn the child, which imports trio and msgspec, and get one answer (the least a
  host's start can cost).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import trio

CHILD = Path(__file__).resolve().parent / "_floor_child.py"
PREFIX_BYTES = 4
READ_CHUNK = 1 << 20


def frame(reply_size: int, payload: object) -> bytes:
    """A frame asking the child for `reply_size` bytes, carrying `payload`."""
    encoded = msgspec.msgpack.encode((reply_size, payload))
    return len(encoded).to_bytes(PREFIX_BYTES, "little") + encoded


class FloorChild:
    """A running `_floor_child.py` and the parent's end of its pipes."""

    def __init__(self, process: trio.Process) -> None:
        assert process.stdin is not None
        assert process.stdout is not None
        self.process = process
        self._send = process.stdin
        self._receive = process.stdout
        self._buffer = bytearray()
        self._decoder = msgspec.msgpack.Decoder(tuple[int, Any])

    async def exchange(self, data: bytes) -> None:
        """Send `data` (one frame) and read and decode the answer."""
        await self._send.send_all(data)
        buffer = self._buffer
        while True:
            if len(buffer) >= PREFIX_BYTES:
                end = PREFIX_BYTES + int.from_bytes(buffer[:PREFIX_BYTES], "little")
                if len(buffer) >= end:
                    with memoryview(buffer) as view:
                        self._decoder.decode(view[PREFIX_BYTES:end])
                    del buffer[:end]
                    return
            chunk = await self._receive.receive_some(READ_CHUNK)
            if not chunk:
                raise RuntimeError("the floor child exited")
            buffer += chunk


@asynccontextmanager
async def open_floor_child() -> AsyncIterator[FloorChild]:
    process = await trio.lowlevel.open_process(
        [sys.executable, str(CHILD)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        yield FloorChild(process)
    finally:
        with trio.CancelScope(shield=True):
            assert process.stdin is not None
            await process.stdin.aclose()
            with trio.move_on_after(5):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()


async def ping_pong(
    child: FloorChild, runs: int, request_bytes: int, reply_bytes: int
) -> list[float]:
    """`runs` round trips of a `request_bytes` frame answered by a `reply_bytes` frame, each
    timed from the encoding of the request to the decoded answer (seconds)."""
    payload = b"x" * request_bytes
    timings = []
    for _ in range(runs):
        start = time.perf_counter()
        await child.exchange(frame(reply_bytes, payload))
        timings.append(time.perf_counter() - start)
    return timings


async def one_way(child: FloorChild, runs: int, payload: object) -> list[float]:
    """`runs` one-way transfers of `payload` (bytes, or a value such as a list of objects):
    its encoding, the pipe, the child's read and decode, its few-byte answer; in seconds."""
    timings = []
    for _ in range(runs):
        start = time.perf_counter()
        await child.exchange(frame(0, payload))
        timings.append(time.perf_counter() - start)
    return timings


async def cold_start() -> float:
    """Seconds from spawning the child to its first decoded answer."""
    start = time.perf_counter()
    async with open_floor_child() as child:
        await child.exchange(frame(0, b""))
        elapsed = time.perf_counter() - start
    return elapsed
