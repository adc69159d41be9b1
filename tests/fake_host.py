"""A misbehaving host program for the client-side fuzz (tests/test_fuzz_client.py).

    python tests/fake_host.py MODE ARG COUNTER_FILE REAL_HOST_ARGV...

The first start (COUNTER_FILE holds how many there were) misbehaves as MODE says; every later
start execs the real host, so the test can check that the next operation recovers.

Modes before the handshake: `exit` (exit with status ARG at once), `exit-at-hello` (read the
hello, exit with status ARG), `garbage` (read the hello, write the bytes ARG (hex), close stdout,
then read stdin until EOF), `half-ready` (write half of a Ready frame, then read stdin until EOF).
Modes after ARG frames of a real host (this program proxies it), at once: `garbage-after`
(write garbage), `half-after` (write half of a frame and stall), `exit-after` (kill the real
host and exit with status 7).
Plain Python, no codemode import: it starts in a few milliseconds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

HALF_FRAME = (44).to_bytes(4, "little") + b"\x83\xa4type\xb0connection/ready"
"""The first 22 bytes of a frame that declares 44."""


def _read_exactly(fd: int, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _read_frame(fd: int) -> bytes | None:
    header = _read_exactly(fd, 4)
    if header is None:
        return None
    payload = _read_exactly(fd, int.from_bytes(header, "little"))
    return None if payload is None else header + payload


def _drain_stdin() -> None:
    while os.read(0, 65536):
        pass


def _proxy(mode: str, frames: int, real: list[str]) -> None:
    child = subprocess.Popen(real, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdin is not None
    assert child.stdout is not None
    child_in = child.stdin.fileno()
    child_out = child.stdout.fileno()

    def forward_stdin() -> None:
        while chunk := os.read(0, 65536):
            try:
                os.write(child_in, chunk)
            except BrokenPipeError:
                break
        child.stdin.close()  # type: ignore[union-attr]

    threading.Thread(target=forward_stdin, daemon=True).start()
    count = 0
    while count < frames and (frame := _read_frame(child_out)) is not None:
        os.write(1, frame)
        count += 1
    if count < frames:
        child.wait()
        return
    # Break at once, with whatever the real host has in flight.
    if mode == "exit-after":
        child.kill()
        child.wait()
        os._exit(7)
    if mode == "garbage-after":
        os.write(1, b"\x05\x00\x00\x00not msgpack at all")
    else:  # half-after: half of a frame, then nothing more
        os.write(1, HALF_FRAME)
    # Stall: swallow what the real host writes until the client closes our stdin (the EOF
    # reaches the real host, which exits) or kills us.
    while os.read(child_out, 65536):
        pass
    child.wait()


def main() -> None:
    mode, argument, counter_file, *real = sys.argv[1:]
    counter = Path(counter_file)
    starts = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(starts + 1))
    if starts > 0:
        os.execv(real[0], real)
    if mode == "exit":
        os._exit(int(argument))
    if mode.endswith("-after"):
        _proxy(mode, int(argument), real)
        return
    hello = _read_frame(0)
    if mode == "exit-at-hello":
        os._exit(int(argument))
    assert hello is not None
    if mode == "garbage":
        # Then close stdout: a garbage prefix that declares a long frame ends at once
        # (a stall is `half-ready`'s case).
        os.write(1, bytes.fromhex(argument))
        os.close(1)
    elif mode == "half-ready":
        os.write(1, HALF_FRAME)
    _drain_stdin()


if __name__ == "__main__":
    main()
