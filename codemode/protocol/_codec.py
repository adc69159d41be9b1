"""Length-prefixed msgpack framing, sans-IO (reference-host 2.1; DESIGN section 3).

A frame is a 4-byte little-endian unsigned payload length, then the payload: one msgpack-encoded
message. `MAX_FRAME_BYTES` bounds the payload.

- `FrameEncoder.encode(message)` returns the whole frame, or raises `FrameTooLargeError` before
  anything is queued: an oversized message never reaches the wire.
- `FrameDecoder.receive_data(chunk)` takes bytes cut anywhere (split and merged reads, split
  prefixes); `next_message()` returns the next whole message or `NEED_DATA`. A declared length
  over the limit raises `FrameTooLargeError` before the payload is buffered; bytes that do not
  decode raise `FrameDecodeError`. Both are `ProtocolError`s, and the only errors it raises.
"""

from __future__ import annotations

import enum
import struct
from typing import Generic, TypeVar

import msgspec

MAX_FRAME_BYTES = 64 * 1024 * 1024
_PREFIX = struct.Struct("<I")

M = TypeVar("M")


class ProtocolError(Exception):
    """The byte stream broke the framing or message rules."""


class FrameTooLargeError(ProtocolError):
    """A frame's payload exceeds MAX_FRAME_BYTES."""

    def __init__(self, length: int) -> None:
        super().__init__(f"code-mode IPC frame length {length} exceeds {MAX_FRAME_BYTES} bytes")
        self.length = length


class FrameDecodeError(ProtocolError):
    """A frame's payload is not a valid message."""


class NeedData(enum.Enum):
    NEED_DATA = "NEED_DATA"


NEED_DATA = NeedData.NEED_DATA


class FrameEncoder:
    """Encodes messages into frames, checking the size first."""

    def __init__(self) -> None:
        self._encoder = msgspec.msgpack.Encoder()

    def encode(self, message: object) -> bytes:
        buffer = bytearray(_PREFIX.size)
        self._encoder.encode_into(message, buffer, _PREFIX.size)
        length = len(buffer) - _PREFIX.size
        if length > MAX_FRAME_BYTES:
            raise FrameTooLargeError(length)
        _PREFIX.pack_into(buffer, 0, length)
        return bytes(buffer)


class FrameDecoder(Generic[M]):
    """Turns a byte stream into messages of type `M` (a tagged union)."""

    def __init__(self, message_type: type[M]) -> None:
        self._decoder = msgspec.msgpack.Decoder(message_type)
        self._buffer = bytearray()
        self._position = 0

    @property
    def buffered(self) -> int:
        """Bytes received and not yet decoded."""
        return len(self._buffer) - self._position

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        self._buffer += data

    def next_message(self) -> M | NeedData:
        available = len(self._buffer) - self._position
        if available < _PREFIX.size:
            return self._compact(NEED_DATA)
        (length,) = _PREFIX.unpack_from(self._buffer, self._position)
        if length > MAX_FRAME_BYTES:
            raise FrameTooLargeError(length)
        if available < _PREFIX.size + length:
            return self._compact(NEED_DATA)
        start = self._position + _PREFIX.size
        payload = memoryview(self._buffer)[start : start + length]
        self._position = start + length
        try:
            return self._decoder.decode(payload)
        except msgspec.DecodeError as error:
            raise FrameDecodeError(f"failed to decode code-mode IPC frame: {error}") from None
        finally:
            payload.release()

    def _compact(self, result: NeedData) -> NeedData:
        if self._position:
            del self._buffer[: self._position]
            self._position = 0
        return result
