"""The floor's child process: imports trio and msgspec, and answers length-prefixed msgpack
frames on stdin/stdout, the least a host process can do.

Run as a script (`python benchmarks/_floor_child.py`), it imports nothing else, so its start is
the floor of the host's cold start. Each frame it reads is a msgpack array `[reply_size,
payload]` (payload: bytes, or any value): it decodes it (the cost the host pays for every
frame), then answers with a frame whose payload is the msgpack encoding of `reply_size`
bytes (0: a tiny acknowledgement, the one-way floor). It grows its pipes to 1 MiB, as
`codemode-host` does, and exits at end of input.
"""

from __future__ import annotations

import fcntl
import os
import struct
from typing import Any

import msgspec
import trio

PREFIX = struct.Struct("<I")
PIPE_SIZE = 1 << 20
READ_CHUNK = 1 << 20


async def serve() -> None:
    for fd in (0, 1):
        try:
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        except OSError:
            pass
    decoder = msgspec.msgpack.Decoder(tuple[int, Any])
    encoder = msgspec.msgpack.Encoder()
    answers: dict[int, bytes] = {}
    receive = trio.lowlevel.FdStream(os.dup(0))
    send = trio.lowlevel.FdStream(os.dup(1))
    buffer = bytearray()
    async with receive, send:
        while chunk := await receive.receive_some(READ_CHUNK):
            buffer += chunk
            while len(buffer) >= PREFIX.size:
                (length,) = PREFIX.unpack_from(buffer)
                end = PREFIX.size + length
                if len(buffer) < end:
                    break
                with memoryview(buffer) as view:
                    reply_size, _ = decoder.decode(view[PREFIX.size : end])
                del buffer[:end]
                answer = answers.get(reply_size)
                if answer is None:
                    payload = encoder.encode((0, b"x" * reply_size))
                    answer = answers[reply_size] = PREFIX.pack(len(payload)) + payload
                await send.send_all(answer)


if __name__ == "__main__":
    trio.run(serve)
