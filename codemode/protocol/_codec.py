"""Length-prefixed msgpack framing, sans-IO (design.md, host 2.1; design.md, design 3).

A frame is a 4-byte little-endian unsigned payload length, then the payload: one msgpack-encoded
message. `MAX_FRAME_BYTES` bounds the payload.

- `FrameEncoder.encode(message)` returns the whole frame, or raises `FrameTooLargeError` before
  anything is queued: an oversized message of our own never reaches the wire, and is a local
  refusal (`LocalProtocolError`), not the peer's fault.
- `FrameDecoder.receive_data(chunk)` takes bytes cut anywhere (split and merged reads, split
  prefixes); `next_message()` returns the next whole message or `NEED_DATA`. A declared length
  over the limit raises `FrameLengthError` before the payload is buffered; a whole frame that
  does not decode raises `FrameDecodeError`, which carries the payload (the host answers some
  of those instead of ending the connection) and is consumed. Both are `RemoteProtocolError`s,
  and the only errors it raises.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from typing import Final, Generic, TypeVar

import msgspec

from ._errors import LocalProtocolError, RemoteProtocolError

# `Final`: the compiled build reads these as C statics, where a module global is a dictionary
# lookup (and a `Struct`'s method one more) for every frame of every cell.
MAX_FRAME_BYTES: Final = 64 * 1024 * 1024
PREFIX_BYTES: Final = 4
"""Bytes of the length prefix of every frame (a little-endian unsigned 32-bit integer)."""
_EMPTY_PREFIX: Final = bytes(PREFIX_BYTES)
_pack_length: Final = struct.Struct("<I").pack_into
_unpack_length: Final = struct.Struct("<I").unpack_from
_COPY_BELOW: Final = 64 * 1024
"""A payload shorter than this is decoded from a copy of its bytes: making, slicing and
releasing a memoryview cost more than copying a frame of a cell's path (about a kilobyte), and
only a large payload is worth decoding in place."""

M = TypeVar("M")


class FrameTooLargeError(LocalProtocolError):
    """A message of ours whose frame would exceed MAX_FRAME_BYTES: nothing was queued."""

    def __init__(self, length: int) -> None:
        super().__init__(f"code-mode IPC frame length {length} exceeds {MAX_FRAME_BYTES} bytes")
        self.length = length


class FrameLengthError(RemoteProtocolError):
    """The peer declared a frame longer than MAX_FRAME_BYTES."""

    def __init__(self, length: int) -> None:
        super().__init__(f"code-mode IPC frame length {length} exceeds {MAX_FRAME_BYTES} bytes")
        self.length = length


class FrameDecodeError(RemoteProtocolError):
    """A whole frame whose payload is not a valid message.

    Attributes:
        payload: the frame's payload (the decoder moved past it).
        problem: what msgspec found wrong, with the path of the field.
    """

    def __init__(self, problem: str, payload: bytes) -> None:
        super().__init__(f"failed to decode code-mode IPC frame: {problem}")
        self.problem = problem
        self.payload = payload


class NeedData(enum.Enum):
    NEED_DATA = "NEED_DATA"


NEED_DATA: Final = NeedData.NEED_DATA


class FrameEncoder:
    """Encodes messages into frames, checking the size first."""

    def __init__(self) -> None:
        self._encode_into: Callable[[object, bytearray, int], None] = (
            msgspec.msgpack.Encoder().encode_into
        )

    def encode(self, message: object) -> bytes:
        """The whole frame of `message`.

        Raises:
            FrameTooLargeError: the payload would exceed MAX_FRAME_BYTES.
        """
        buffer = bytearray()
        self.encode_into(message, buffer)
        return bytes(buffer)

    def encode_into(self, message: object, out: bytearray) -> None:
        """Append the frame of `message` to `out` (left as it was if encoding fails).

        Raises:
            FrameTooLargeError: the payload would exceed MAX_FRAME_BYTES.
            TypeError, ValueError, msgspec.EncodeError: a value with no msgpack form.
        """
        start = len(out)
        out += _EMPTY_PREFIX
        try:
            self._encode_into(message, out, start + PREFIX_BYTES)
        except BaseException:
            del out[start:]  # a value with no msgpack form: the frames before stay whole
            raise
        length = len(out) - start - PREFIX_BYTES
        if length > MAX_FRAME_BYTES:
            del out[start:]
            raise FrameTooLargeError(length)
        _pack_length(out, start, length)


class FrameDecoder(Generic[M]):
    """Turns a byte stream into messages of type `M` (a tagged union)."""

    def __init__(self, message_type: type[M]) -> None:
        self._decode: Callable[[bytes | bytearray | memoryview], M] = msgspec.msgpack.Decoder(
            message_type
        ).decode
        self._buffer = bytearray()
        self._position = 0

    @property
    def buffered(self) -> int:
        """Bytes received and not yet decoded."""
        return len(self._buffer) - self._position

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        self._buffer += data

    def next_message(self) -> M | NeedData:
        buffer = self._buffer
        position = self._position
        available = len(buffer) - position
        if available < PREFIX_BYTES:
            return self._compact()
        length: int = _unpack_length(buffer, position)[0]
        if length > MAX_FRAME_BYTES:
            raise FrameLengthError(length)
        if available < PREFIX_BYTES + length:
            return self._compact()
        start = position + PREFIX_BYTES
        end = start + length
        self._position = end
        if length < _COPY_BELOW:
            payload = buffer[start:end]
            try:
                return self._decode(payload)
            except msgspec.DecodeError as error:
                raise FrameDecodeError(str(error), bytes(payload)) from None
        view = memoryview(buffer)[start:end]
        try:
            return self._decode(view)
        except msgspec.DecodeError as error:
            raise FrameDecodeError(str(error), bytes(view)) from None
        finally:
            view.release()  # the buffer must be resizable again

    def _compact(self) -> NeedData:
        if self._position:
            del self._buffer[: self._position]
            self._position = 0
        return NEED_DATA
