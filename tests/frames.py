"""Reading whole messages from a trio byte stream with the sans-IO frame decoder, for tests
that talk to a host frame by frame (the adapters feed bytes to their connections instead)."""

from __future__ import annotations

from typing import TypeVar

import trio

from codemode.protocol import NEED_DATA, FrameDecoder, ProtocolError

M = TypeVar("M")

READ_CHUNK = 65536
"""Bytes asked for per read: more only arrives while a large frame is incomplete."""


async def receive_message(stream: trio.abc.ReceiveStream, decoder: FrameDecoder[M]) -> M | None:
    """The next whole message, or None at EOF on a frame boundary.

    Raises:
        ProtocolError: a frame over the limit, an undecodable frame, or EOF inside a frame.
    """
    while True:
        message = decoder.next_message()
        if message is not NEED_DATA:
            return message
        chunk = await stream.receive_some(READ_CHUNK)
        if not chunk:
            if decoder.buffered:
                raise ProtocolError("EOF inside a code-mode IPC frame")
            return None
        decoder.receive_data(chunk)
