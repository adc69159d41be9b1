"""The listening host under the listener benchmark (`listener_bench.py`): its process, the
figures read from its /proc entries, and the silent connections beside its clients."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import trio

from benchmarks._proc import rss_bytes

PREFIX = b"codemode-host listening on "
SAMPLE_EVERY = 0.25
RETURN_BOUND = 60.0
"""Seconds the host has to close its descriptors after the clients left."""
SETTLE_BOUND = 15.0
"""Seconds its RSS is watched after that, until it has not fallen for `SETTLE_QUIET`."""
SETTLE_QUIET = 3.0


class Host:
    def __init__(self, process: trio.Process, address: str, log: Path) -> None:
        self.process = process
        self.address = address
        self.log = log
        self.pid = process.pid

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def rss(self) -> int:
        return rss_bytes(self.pid)

    def log_count(self, text: str) -> int:
        return self.log.read_text(errors="replace").count(text)


@asynccontextmanager
async def listening_host(options: Sequence[str]) -> AsyncIterator[Host]:
    with tempfile.NamedTemporaryFile(prefix="codemode-listener-", suffix=".log") as log:
        environment = {
            name: value
            for name, value in os.environ.items()
            if name not in {"CODEMODE_HOST_PARENT", "CODEMODE_HOST_TOKEN"}
        }
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "codemode_host", "--listen", "tcp://127.0.0.1:0", *options],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            env=environment,
        )
        try:
            assert process.stdout is not None
            line = b""
            while not line.endswith(b"\n"):
                chunk = await process.stdout.receive_some(1)
                if not chunk:
                    raise RuntimeError(f"the host did not listen: {line!r}")
                line += chunk
            if not line.startswith(PREFIX):
                raise RuntimeError(f"the host did not listen: {line!r}")
            yield Host(process, line[len(PREFIX) :].decode().strip(), Path(log.name))
        finally:
            with trio.CancelScope(shield=True):
                process.terminate()
                with trio.move_on_after(15):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
                    await process.wait()
                if process.stdout is not None:
                    await process.stdout.aclose()


@dataclass
class Silent:
    """The silent connections' tally."""

    present: int = 0
    opened: int = 0
    evicted: int = 0
    refused: int = 0
    all_opened: trio.Event = field(default_factory=trio.Event)


async def silent_connection(
    host: str, port: int, tally: Silent, limiter: trio.CapacityLimiter, target: int
) -> None:
    while True:
        try:
            async with limiter:
                stream = await trio.open_tcp_stream(host, port)
        except OSError:
            tally.refused += 1
            await trio.sleep(0.1)
            continue
        tally.present += 1
        tally.opened += 1
        if tally.opened == target:
            tally.all_opened.set()
        try:
            async with stream:
                try:
                    while await stream.receive_some(4096):
                        pass  # whatever the host says before closing
                except trio.BrokenResourceError:
                    pass
            tally.evicted += 1
        finally:
            tally.present -= 1


@dataclass
class Watch:
    """The host's RSS and descriptors sampled during the run: their peaks."""

    rss: int = 0
    fds: int = 0
    samples: int = 0


async def sample_peaks(host: Host, watch: Watch) -> None:
    while True:
        watch.rss = max(watch.rss, host.rss())
        watch.fds = max(watch.fds, host.fds())
        watch.samples += 1
        await trio.sleep(SAMPLE_EVERY)


async def read_line(stream: trio.abc.ReceiveStream, buffer: bytearray) -> bytes:
    while b"\n" not in buffer:
        chunk = await stream.receive_some(65536)
        if not chunk:
            raise RuntimeError(f"a client process ended early: {bytes(buffer[-200:])!r}")
        buffer += chunk
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    return line


async def back_to(host: Host, fds: int) -> tuple[int, float]:
    """Poll the host's descriptors until they are at most `fds` (bounded); the count and how
    long it took."""
    start = time.perf_counter()
    with trio.move_on_after(RETURN_BOUND):
        while host.fds() > fds:  # noqa: ASYNC110 - another process's state: nothing to wait on
            await trio.sleep(0.1)
    return host.fds(), time.perf_counter() - start


async def settled_rss(host: Host) -> int:
    """The host's RSS once it has not fallen for `SETTLE_QUIET` s (at most `SETTLE_BOUND`)."""
    lowest, since = host.rss(), time.perf_counter()
    with trio.move_on_after(SETTLE_BOUND):
        while time.perf_counter() - since < SETTLE_QUIET:
            await trio.sleep(0.25)
            now = host.rss()
            if now < lowest:
                lowest, since = now, time.perf_counter()
    return host.rss()
