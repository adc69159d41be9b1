"""Receiving what the peer sent, for a sans-IO connection: one pass of the trio scheduler per
arrival.

Both ends of the wire read with a `ChunkReader`. On a pipe or a plain socket it waits until the
descriptor is readable and then reads once; anything else (TLS, memory streams) goes through
the stream's own `receive_some`.

Why: trio's `receive_some` on a pipe reads first and, when it got data, checkpoints after the
read; the next call reads again, finds nothing and only then waits. Each frame that arrived on
its own cost its reader two passes of the scheduler and an extra system call, on both ends of
every request (design.md, "Measured notes", issue 10). Waiting first is the checkpoint: a peer that
floods still lets the other tasks run between two reads.

Rules:
1. The descriptor is looked up before every wait: a stream closed meanwhile raises
   `trio.ClosedResourceError`, never a read of a descriptor number reused since.
2. Errors are trio's: a failed read is `trio.BrokenResourceError`; end of input is `b""`.
3. A read asks for `SMALL_READ` bytes, and for `max_bytes` only after a read that filled its
   size (a large frame is arriving). `os.read` allocates the size it asks for, and glibc maps
   and unmaps a megabyte at each call: two system calls, and an unmap that interrupts the
   other cores, for every frame of a few hundred bytes.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable

import trio

SMALL_READ = 64 << 10
"""Bytes a read asks for while frames are small (rule 3): below glibc's mmap threshold."""


class ChunkReader:
    """The receiving side of one connection.

    Args:
        stream: where the bytes come from (a pipe's `FdStream` and a `SocketStream` are read
            directly).
        max_bytes: the most one read returns.
    """

    def __init__(self, stream: trio.abc.ReceiveStream, max_bytes: int) -> None:
        self._stream = stream
        self._max_bytes = max_bytes
        self._size = min(SMALL_READ, max_bytes)

    async def receive_some(self) -> bytes | bytearray:
        """What arrived next (at least one byte), or `b""` at the end of input."""
        stream = self._stream
        if isinstance(stream, trio.lowlevel.FdStream):
            return await self._read(stream.fileno)
        if isinstance(stream, trio.SocketStream):
            return await self._read(stream.socket.fileno)
        return await stream.receive_some(self._max_bytes)

    async def _read(self, fileno: Callable[[], int]) -> bytes:
        while True:
            fd = fileno()
            if fd < 0:
                raise trio.ClosedResourceError("the stream was closed")  # rule 1
            await trio.lowlevel.wait_readable(fd)
            size = self._size
            try:
                data = os.read(fd, size)
            except BlockingIOError:
                continue  # woken without data (another reader of a shared descriptor)
            except OSError as error:
                if error.errno == errno.EBADF:
                    raise trio.ClosedResourceError("the stream was closed") from None
                raise trio.BrokenResourceError(error) from error
            # Rule 3: a full read means more is coming.
            self._size = self._max_bytes if len(data) == size else min(SMALL_READ, self._max_bytes)
            return data
