"""One stream pair a host link's connection is on: its writer, its reader and its heartbeat,
until the stream ends or the link lets go of it (`_link_core.py`; a resumed connection is on
several, one after another: its rule 4).

A `LinkStream` does no protocol: it hands what it reads to its link (`StreamOwner.received`)
and reports how it stopped: a cut (the link decides whether it resumes), a failure, or the
host's end of file read to the end. Once let go of (`let_go`), it reports nothing more: its
writer never writes again and its reading stops.

The reading is not a task of its own but a job of the link's call workers (`_Reading`), which
moves from worker to worker: the worker that holds it reads, hands what arrived to the link, and
then runs the delegate calls that arrived, inline, one after the other. A call that returns
without suspending (a tool that answers at once) so costs no other task and no pass of the
scheduler. When a call suspends, its worker hands the reading on to another worker (which first
runs the calls still waiting), and finishes the call. The reading holds the same order as a
single reader task: the calls of one arrival start in the order they came, after every other
event of that arrival was dispatched, and before anything read later. Being a worker's job, the
reading runs where the calls do (the provider's detached nursery), so a call that ignores
cancellation never holds the link's own nursery open.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Protocol

import trio

from .._trio import CallWorkers, ChunkReader, DelegateCall, FrameWriter, Heartbeat
from .._trio._callbacks import FirstSuspension, Job, Worker

READ_CHUNK = 1 << 20


class StreamOwner(Protocol):
    """What a stream reports to its link."""

    def received(self, data: bytes | bytearray, calls: deque[DelegateCall]) -> bool:
        """Bytes from the host (b"": its end of file, when it is not a cut); False: the
        connection is over, stop reading. The delegate calls they start go in `calls`, which
        the reading runs next."""
        ...

    def stream_cut(self, stream: LinkStream, reason: str) -> bool:
        """The stream ended or broke: True when the link resumes (the stream stops quietly)."""
        ...

    def stream_failed(self, reason: str, cause: BaseException) -> None:
        """The stream broke and the link does not resume: it is lost."""
        ...

    async def stream_ended(self) -> None:
        """The reader stopped for good (the host's end of file, a protocol error)."""
        ...


class LinkStream:
    """A stream pair in use by a link, from `start` until it stopped or was let go of."""

    def __init__(
        self,
        owner: StreamOwner,
        send: trio.abc.SendStream,
        receive: trio.abc.ReceiveStream,
        take: Callable[[], bytes | bytearray],
    ) -> None:
        self._owner = owner
        self.receiver = ChunkReader(receive, READ_CHUNK)
        self._reading: _Reading | None = None
        self.writer = FrameWriter(send, take)
        self.heartbeat = Heartbeat()
        self.current = True
        """False once the link let go of it."""
        self.over = False
        """True once the reading found the connection over (`ended()` then tells the link)."""

    def start(self, nursery: trio.Nursery, workers: CallWorkers) -> None:
        """Write in a task of `nursery`; read in `workers` (the workers of the link's calls)."""
        nursery.start_soon(self.writer.run, self._write_failed)
        self._reading = _Reading(self, workers)
        workers.run(self._reading)

    def flush(self) -> None:
        self.writer.flush()

    def let_go(self) -> None:
        """The link is done with this stream: nothing more is written, read or reported."""
        self.current = False
        self.writer.abandon()
        self.stop_reading()

    def stop_reading(self) -> None:
        """Read no more (the link's end): a read in progress is cancelled."""
        if self._reading is not None:
            self._reading.stop()

    def watch(
        self, nursery: trio.Nursery, ping: Callable[[], bool], silent: Callable[[str], None]
    ) -> None:
        """Run the heartbeat on this stream (it ends with the stream)."""

        def ping_here() -> bool:
            return self.current and ping()

        def silent_here(reason: str) -> None:
            if self.current:
                silent(reason)

        nursery.start_soon(self.heartbeat.run, ping_here, silent_here)

    def _write_failed(self, error: BaseException) -> None:
        if self.current and not self._owner.stream_cut(self, f"failed to write: {error}"):
            self._owner.stream_failed(f"failed to write code-mode host message: {error}", error)

    def arrived(self, data: bytes | bytearray, calls: deque[DelegateCall]) -> bool:
        """Hand what was read to the link, the calls it starts into `calls`. False: read no
        more, and if the connection is over, `ended()` is next (`over`)."""
        owner = self._owner
        if not self.current:
            return False
        self.heartbeat.heard()
        if not data and owner.stream_cut(self, "the host closed the stream"):
            return False
        if owner.received(data, calls):
            return True
        self.over = True  # end of file, a protocol error, or the link was given up
        return False

    def read_failed(self, error: trio.BrokenResourceError | trio.ClosedResourceError) -> None:
        """The read broke: a cut, or the end of the connection (`over`)."""
        owner = self._owner
        if self.current and not owner.stream_cut(self, f"failed to read: {error}"):
            owner.stream_failed(f"failed to read code-mode host message: {error}", error)
            self.over = True

    def failed(self, error: Exception) -> None:
        """Reading broke on a bug of this side: the link is lost (its other users go on)."""
        self.over = True
        self._owner.stream_failed(f"code-mode client failed reading: {error!r}", error)

    async def ended(self) -> None:
        """The reading stopped for good with the connection over (`over`)."""
        await self._owner.stream_ended()


class _Reading(Job):
    """The reading of a `LinkStream`, a job handed from worker to worker (module docstring).

    At most one worker holds it at a time. `calls` holds the delegate calls that arrived and
    have not run yet; whoever holds the reading runs them before it reads again.
    """

    def __init__(self, stream: LinkStream, workers: CallWorkers) -> None:
        self._stream = stream
        self._workers = workers
        self._calls: deque[DelegateCall] = deque()
        self._holder: Worker | None = None
        self._stopped = False

    def stop(self) -> None:
        """Read no more: the holder's read is cancelled (a call it runs has not suspended yet:
        one that did handed the reading on first, and runs on)."""
        self._stopped = True
        if self._holder is not None:
            self._holder.cancel()

    def _hand_on(self) -> None:
        """The holder is busy with a call: another worker goes on reading."""
        self._holder = None
        if self._stopped:
            self._give_up()
            return
        try:
            self._workers.run(self)
        except RuntimeError:  # the workers' nursery is closed: the provider is gone
            self._stopped = True
            self._calls.clear()

    def _give_up(self) -> None:
        """Reading stopped: the calls that arrived still run, each in a worker (cancelled,
        they meet their cancellation there)."""
        calls = self._calls
        try:
            while calls:
                self._workers.run(calls.popleft())
        except RuntimeError:  # the workers' nursery is closed: the provider is gone
            calls.clear()

    def _held_by(self, worker: Worker) -> bool:
        # A method, not a test in `run`: there mypy narrows `_holder` to the worker `run`
        # stored, and the compiled build trusts that across the awaits that change it.
        return self._holder is worker

    async def _run_calls(self, worker: Worker) -> None:
        """Run the calls that arrived, inline, one after the other, until none is left, one
        suspended (the reading was handed on), or the worker was stopped."""
        calls = self._calls
        while calls:
            call = calls.popleft()
            if call.cancelled:
                self._workers.run(call)  # it meets its cancellation in a worker
                continue
            await call.run_inline(worker)
            if not self._held_by(worker) or worker.cancelled:
                return

    async def run(self, worker: Worker) -> None:
        self._holder = worker
        calls = self._calls
        stream = self._stream
        receiver = stream.receiver
        try:
            while not self._stopped:
                if calls:
                    await FirstSuspension(self._run_calls(worker), self._hand_on)
                    if not self._held_by(worker):
                        return  # one suspended: another worker reads, this one ran the call
                    if worker.cancelled:  # stopped, or a call cancelled itself
                        self._hand_on()
                        return
                try:
                    data = await receiver.receive_some()
                except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
                    stream.read_failed(error)
                    break
                if not stream.arrived(data, calls):
                    break
        except Exception as bug:  # never out of a worker, whose nursery is shared
            if not self._held_by(worker):
                raise  # a call's, after it handed the reading on (calls contain their own)
            stream.failed(bug)
        self._holder = None
        self._stopped = True
        self._give_up()
        if stream.over:
            await stream.ended()
