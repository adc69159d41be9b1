"""The byte side both connections share: frames queued out, frames decoded in, events out.

`Endpoint` owns the outgoing buffer (`data_to_send`, or `take_outgoing` for an adapter that
writes the buffer itself), the incoming decoder (`receive_data`),
end of file, and the event queue (`next_event`); a connection subclass says what a received
message means (`_receive`, which appends events) and queues its own frames (`_queue`).
"""

from __future__ import annotations

import collections
from typing import Generic, TypeVar

from ._codec import NEED_DATA, FrameDecoder, FrameEncoder, NeedData
from ._errors import RemoteProtocolError
from ._events import ConnectionEnded

M = TypeVar("M")
"""The messages this side receives."""
E = TypeVar("E")
"""The events this side hands out."""


class Endpoint(Generic[M, E]):
    """Bytes in, events out; frames queued, bytes out. No I/O."""

    def __init__(self, incoming: object) -> None:
        self._encoder = FrameEncoder()
        self._decoder: FrameDecoder[M] = FrameDecoder(incoming)  # type: ignore[arg-type]
        self._outgoing = bytearray()
        self._events: collections.deque[E | ConnectionEnded] = collections.deque()
        self._closed = False
        self._eof = False

    def data_to_send(self) -> bytes:
        """Every frame queued since the last call, in order (b"" when there is none)."""
        return bytes(self.take_outgoing())

    def take_outgoing(self) -> bytearray:
        """As `data_to_send`, but the buffer itself, which the caller now owns: no copy of
        what may be a frame of many megabytes (the trio adapters' `FrameWriter` writes it)."""
        data, self._outgoing = self._outgoing, bytearray()
        return data

    def receive_data(self, data: bytes | bytearray) -> None:
        """Feed bytes read from the peer; b"" means end of file."""
        if data:
            self._decoder.receive_data(data)
        else:
            self._eof = True

    def next_event(self) -> E | ConnectionEnded | NeedData:
        """The next event, or NEED_DATA when more bytes must be read first. One frame is
        decoded at a time, so an adapter acts on each event before the next frame is read.

        Raises:
            RemoteProtocolError: the peer broke the protocol (framing, ids, ordering).
        """
        while not self._events:
            if self._closed:
                return NEED_DATA
            message = self._decoder.next_message()
            if message is NEED_DATA:
                if not self._eof:
                    return NEED_DATA
                if self._decoder.buffered:
                    raise RemoteProtocolError("EOF inside a code-mode IPC frame")
                self._closed = True
                return ConnectionEnded()
            self._receive(message)
        return self._events.popleft()

    def _receive(self, message: M) -> None:
        raise NotImplementedError

    def _queue(self, message: object) -> None:
        self._encoder.encode_into(message, self._outgoing)
