"""Listening hosts for the socket transport and remote provider tests.

`listening_host(*options)` starts `codemode-host --listen ...` as a real process, waits for the
line it prints once it listens (never a sleep), and yields its address; on exit the host is
stopped (SIGTERM, then SIGKILL after a bound) and reaped, so no process outlives a test. Its
stderr goes to a file the test can read (`RunningHost.log()`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

PREFIX = b"codemode-host listening on "
STOP_BOUND = 15.0


def host_command(*options: str) -> list[str]:
    return [sys.executable, "-m", "codemode_host", *options]


class RunningHost:
    """A started listening host: its process and the address it printed."""

    def __init__(self, process: trio.Process, address: str, log: Path) -> None:
        self.process = process
        self.address = address
        self._log = log

    def log(self) -> str:
        return self._log.read_text(errors="replace")

    async def stop(self, signum: int = signal.SIGTERM) -> int:
        """Signal the host and wait for it; its exit status."""
        if self.process.returncode is None:
            self.process.send_signal(signum)
        with trio.move_on_after(STOP_BOUND):
            return await self.process.wait()
        self.process.kill()
        await self.process.wait()
        raise AssertionError(f"the host did not stop on signal {signum}:\n{self.log()}")


async def _read_line(stream: trio.abc.ReceiveStream) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = await stream.receive_some(1)
        if not chunk:
            break
        data += chunk
    return data


@asynccontextmanager
async def listening_host(
    *options: str, listen: str = "tcp://127.0.0.1:0", env: dict[str, str] | None = None
) -> AsyncIterator[RunningHost]:
    """A host listening at `listen` with `options`, for the block's duration."""
    with tempfile.NamedTemporaryFile(prefix="codemode-host-", suffix=".log") as log:
        inherited = {"CODEMODE_HOST_PARENT", "CODEMODE_HOST_TOKEN"}
        environment = {name: value for name, value in os.environ.items() if name not in inherited}
        environment.update(env or {})
        process = await trio.lowlevel.open_process(
            host_command("--listen", listen, *options),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            env=environment,
        )
        try:
            assert process.stdout is not None
            line = await _read_line(process.stdout)
            if not line.startswith(PREFIX):
                await process.wait()
                text = await trio.Path(log.name).read_text(errors="replace")
                raise AssertionError(f"the host did not listen: {line!r}\n{text}")
            host = RunningHost(process, line[len(PREFIX) :].decode().strip(), Path(log.name))
            yield host
        finally:
            with trio.CancelScope(shield=True):
                if process.returncode is None:
                    process.kill()
                await process.wait()
                if process.stdout is not None:
                    await process.stdout.aclose()
