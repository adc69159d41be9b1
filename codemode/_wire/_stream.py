"""One stream pair a host link's connection is on: its writer, its reader and its heartbeat,
until the stream ends or the link lets go of it (`_link_core.py`; a resumed connection is on
several, one after another: its rule 4).

A `LinkStream` does no protocol: it hands what it reads to its link (`StreamOwner.received`)
and reports how it stopped: a cut (the link decides whether it resumes), a failure, or the
host's end of file read to the end. Once let go of (`let_go`), it reports nothing more: its
writer never writes again and its reader ends quietly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import trio

from .._trio import ChunkReader, FrameWriter, Heartbeat

READ_CHUNK = 1 << 20


class StreamOwner(Protocol):
    """What a stream reports to its link."""

    def received(self, data: bytes | bytearray) -> bool:
        """Bytes from the host (b"": its end of file, when it is not a cut); False: the
        connection is over, stop reading."""
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
        self._receive = receive
        self.writer = FrameWriter(send, take)
        self.heartbeat = Heartbeat()
        self.current = True
        """False once the link let go of it."""

    def start(self, nursery: trio.Nursery) -> None:
        nursery.start_soon(self.writer.run, self._write_failed)
        nursery.start_soon(self._read)

    def flush(self) -> None:
        self.writer.flush()

    def let_go(self) -> None:
        """The link is done with this stream: nothing more is written or reported."""
        self.current = False
        self.writer.abandon()

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

    async def _read(self) -> None:
        reader = ChunkReader(self._receive, READ_CHUNK)
        owner = self._owner
        while True:
            try:
                data = await reader.receive_some()
            except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
                if self.current and not owner.stream_cut(self, f"failed to read: {error}"):
                    owner.stream_failed(f"failed to read code-mode host message: {error}", error)
                    await owner.stream_ended()
                return
            if not self.current:
                return
            self.heartbeat.heard()
            if not data and owner.stream_cut(self, "the host closed the stream"):
                return
            if not owner.received(data):
                break  # end of file, a protocol error, or the link was given up
        await owner.stream_ended()
