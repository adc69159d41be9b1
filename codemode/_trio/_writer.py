"""Sending what a sans-IO connection queued: in order, batched per scheduler pass, without a
task hop when the pipe has room.

Both ends of the wire use one `FrameWriter` per connection. The first `flush()` of a pass of
the trio scheduler writes what the connection queued at once, in one non-blocking write to the
pipe's or plain socket's file descriptor; later flushes of the same pass only note that
something is queued, and it all leaves at the end of the pass (a `before_io_wait` instrument
hook, which trio calls once per pass, before it polls for I/O), again in one write. What the
descriptor does not take is left to the writer task (`run`, which also does all the writing
over TLS).

Why: one write per frame cost a system call and a wake-up of the peer per frame (the host's
busiest single line under 64 sessions: design.md, "Measured notes"), and a task hop per
frame about a fifth of a tool call's round trip. Deferring every frame to the end of its
pass cost a lone frame the rest of its pass (about 60 us of a nested tool call's 300 on two
cores: the peer could not start meanwhile). So the first frame of a pass leaves at once, and
the frames of many concurrent cells leave together.

Rules:
1. One byte order: the direct write happens only when the writer task is not writing and
   nothing is left over from before, so bytes never overtake each other.
2. No frame is cut by cancellation: the direct write is a single system call, and the task's
   `send_all` is cancelled only when the connection is over.
3. The hook never raises (trio would drop the instrument): a failed direct write is left to
   the writer task, which meets the error and reports it.
4. The hook wakes the writer task through the trio token (`run_sync_soon`), not by setting an
   event directly: trio chose how long to sleep before it called the hook, so a task woken
   there would wait for the next I/O, which may never come (both ends idle, each waiting for
   the other's bytes).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import trio


class FrameWriter:
    """The writer side of one connection.

    Args:
        stream: where the bytes go (a pipe's `FdStream` and a `SocketStream` allow direct
            writes).
        take: returns (and forgets) every byte the connection queued; a bytearray it returns
            becomes the writer's own (no copy).
    """

    def __init__(self, stream: trio.abc.SendStream, take: Callable[[], bytes | bytearray]) -> None:
        self._stream = stream
        self._take = take
        self._fd = _direct_fd(stream)
        self._left = bytearray()
        self._writing = False
        self._queued = trio.Event()
        self._closing = False
        self._dirty = False
        self._wrote_in_pass = False
        self._hook = _EndOfPass(self)
        self._token: trio.lowlevel.TrioToken | None = None
        self.finished = trio.Event()
        """Set when `run` returned: after `close()`, everything queued before it was written
        (or the stream failed)."""

    def flush(self) -> None:
        """The connection queued something: it leaves now if it is the pass's first write
        (and the writer task is not writing), else when the pass ends."""
        if self._wrote_in_pass or self._writing or self._fd is None or self._token is None:
            self._dirty = True
            return
        self._dirty = False
        self._take_queued()
        if not self._left:
            return  # nothing queued: the pass's first write is still to come
        self._wrote_in_pass = True
        if self._write_direct():
            self._queued.set()  # in a task's step: the loop sees the woken task before it sleeps

    def close(self) -> None:
        """Write what is left, then let `run` return."""
        self._closing = True
        self._queued.set()

    def abandon(self) -> None:
        """The stream is being let go of (cut, to be resumed on another): drop what is left,
        never write again (not even from the end-of-pass hook: the stream's descriptor may be
        closed and reused by the time it runs), and let `run` return."""
        self._fd = None
        self._left = bytearray()
        self._dirty = False
        self._take = bytearray  # whatever the connection queues now is for the next stream
        self.close()

    async def run(self, on_failure: Callable[[BaseException], None]) -> None:
        """Write what the end-of-pass hook could not, until `close()`; a failed write calls
        `on_failure` and ends the task."""
        self._token = trio.lowlevel.current_trio_token()
        trio.lowlevel.add_instrument(self._hook)
        try:
            await self._write_until_closed(on_failure)
        finally:
            trio.lowlevel.remove_instrument(self._hook)
            self.finished.set()

    def _end_of_pass(self) -> None:
        """Send what was queued during the pass: at once if the pipe has room (rule 1), else
        through the writer task (which, when it is writing, takes the rest when it is done)."""
        self._wrote_in_pass = False
        if not self._dirty:
            return
        self._dirty = False
        self._take_queued()
        if self._write_direct() and self._token is not None:
            self._token.run_sync_soon(self._wake)  # rule 4

    def _write_direct(self) -> bool:
        """Write what is left in one non-blocking system call, unless the writer task is
        writing (rule 1); whether the writer task must write the rest."""
        if not self._left or self._writing:
            return False
        if self._fd is not None:
            try:
                written = os.write(self._fd, self._left)
            except OSError:
                written = 0  # full (EAGAIN) or broken: the writer task waits or reports it
            del self._left[:written]
        return bool(self._left)

    def _wake(self) -> None:
        self._queued.set()

    async def _write_until_closed(self, on_failure: Callable[[BaseException], None]) -> None:
        while True:
            # Check before waiting: a `close()` that came while the task was writing set the
            # event only once, and waiting for another one kept a host that refused a
            # handshake or met a protocol error alive until its 5 s shutdown bound
            # (tests/test_fuzz_host.py found it).
            self._dirty = False
            self._take_queued()
            if not self._left:
                if self._closing:
                    return
                await self._queued.wait()
                self._queued = trio.Event()
                continue
            data, self._left = self._left, bytearray()  # handed over whole: no copy
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
        if not data:
            return
        if not self._left and isinstance(data, bytearray):
            self._left = data  # the connection handed its buffer over: a large frame is not copied
        else:
            self._left += data


def _direct_fd(stream: trio.abc.SendStream) -> int | None:
    """The descriptor a pass's bytes can be written to without the writer task: a pipe's, or
    a plain socket's (trio keeps both non-blocking); None for anything else (TLS encrypts in
    the stream, memory streams have no descriptor)."""
    if isinstance(stream, trio.lowlevel.FdStream):
        return stream.fileno()
    if isinstance(stream, trio.SocketStream):
        return stream.socket.fileno()
    return None


class _EndOfPass(trio.abc.Instrument):
    """Calls the writer when the scheduler's pass ends (rule 3: never raises)."""

    def __init__(self, writer: FrameWriter) -> None:
        self._writer = writer

    def before_io_wait(self, timeout: float) -> None:
        try:
            self._writer._end_of_pass()
        except Exception:  # pragma: no cover - a bug; the writer task still sends the bytes
            if self._writer._token is not None:
                self._writer._token.run_sync_soon(self._writer._wake)
