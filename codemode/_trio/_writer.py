"""Sending what a sans-IO connection queued: in order, batched, and at once when possible.

Both ends of the wire use one `FrameWriter` per connection. `flush()` (synchronous) takes every
byte the connection queued; when no write is in progress it writes them to the pipe's file
descriptor at once, non-blocking, and leaves whatever the pipe did not take to the writer task
(`run`). So a request or an answer leaves without a task hop when the pipe has room (measured:
a hop per frame on each side cost about a fifth of a tool call's round trip), and frames queued
while a write is blocked leave together in the next one.

Rules:
1. One byte order: the direct write happens only when the writer task is not writing and
   nothing is left over from before, so bytes never overtake each other.
2. No frame is cut by cancellation: the direct write is a single system call, and the task's
   `send_all` is cancelled only when the connection is over.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import trio


class FrameWriter:
    """The writer side of one connection.

    Args:
        stream: where the bytes go (a pipe's `FdStream` allows direct writes).
        take: returns (and forgets) every byte the connection queued.
    """

    def __init__(self, stream: trio.abc.SendStream, take: Callable[[], bytes]) -> None:
        self._stream = stream
        self._take = take
        self._fd = stream.fileno() if isinstance(stream, trio.lowlevel.FdStream) else None
        self._left = bytearray()
        self._writing = False
        self._queued = trio.Event()
        self._closing = False

    def flush(self) -> None:
        """Send what the connection queued: written now if the pipe has room (rule 1),
        else by the writer task."""
        data = self._take()
        if data:
            self._left += data
        if not self._left:
            return
        if not self._writing and self._fd is not None:
            try:
                written = os.write(self._fd, self._left)
            except (BlockingIOError, InterruptedError):
                written = 0
            except OSError:
                written = 0  # a broken pipe: the writer task meets it and reports it
            del self._left[:written]
        if self._left:
            self._queued.set()

    def close(self) -> None:
        """Write what is left, then let `run` return."""
        self._closing = True
        self._queued.set()

    async def run(self, on_failure: Callable[[BaseException], None]) -> None:
        """Write what `flush` could not, until `close()`; a failed write calls `on_failure`
        and ends the task."""
        while True:
            # Check before waiting: a `close()` that came while the task was writing set the
            # event only once, and waiting for another one kept a host that refused a
            # handshake or met a protocol error alive until its 5 s shutdown bound
            # (tests/test_fuzz_host.py found it).
            self._take_queued()
            if not self._left:
                if self._closing:
                    return
                await self._queued.wait()
                self._queued = trio.Event()
                continue
            data, self._left = bytes(self._left), bytearray()
            self._writing = True
            try:
                await self._stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
                on_failure(error)
                return
            finally:
                self._writing = False

    def _take_queued(self) -> None:
        """Move what the connection queued behind what is left (no direct write)."""
        data = self._take()
        if data:
            self._left += data
