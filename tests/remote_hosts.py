"""Listening hosts for the socket transport and remote provider tests.

`listening_host(*options)` starts `codemode-host --listen ...` as a real process, waits for the
line it prints once it listens (never a sleep), and yields its address; on exit the host is
stopped (SIGTERM, then SIGKILL after a bound) and reaped, so no process outlives a test. Its
stderr goes to a file the test can read (`RunningHost.log()`).

`SharedHost` is one listening host for a whole test session, on a Unix socket, which tests
reach each through a connection of their own (the `remote` row of the `provider` fixture).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
import time
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


_SHARED_PIDS: set[int] = set()


def shared_host_pids() -> set[int]:
    """The pids of the running `SharedHost`s: children of this process that outlive a test
    by design (a test that checks it left no child process must not count them)."""
    return set(_SHARED_PIDS)


class SharedHost:
    """One listening host on a Unix socket in `directory`, shared by the tests of a session
    (the `remote` row of the `provider` fixture: tests/conftest.py).

    Each test connects its own remote provider: a connection of its own, whose sessions, cells
    and admission limits are its own on the host (`codemode_host._listen`, rule 3), and which
    the provider's exit shuts down and closes. What the tests share is the process (its
    engine, its workers); `check()` after each test fails one that left it dead, and the next
    `address()` starts a new one. Started with `subprocess` (a session's fixture runs outside
    any trio run); it watches this process (`CODEMODE_HOST_PARENT`), so it never outlives it.
    """

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._starts = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._address = ""
        self._log = directory / "host.log"

    def log(self) -> str:
        return self._log.read_text(errors="replace") if self._log.exists() else ""

    def address(self) -> str:
        """The host's address, started first if it is not running."""
        if self._process is not None and self._process.poll() is not None:
            _SHARED_PIDS.discard(self._process.pid)
            self._process = None
        if self._process is None:
            self._start()
        return self._address

    def check(self) -> None:
        """Raise if the host is no longer running (a test killed it, or it crashed)."""
        process = self._process
        if process is not None and process.poll() is not None:
            raise AssertionError(
                f"the shared listening host exited with status {process.returncode}:\n{self.log()}"
            )

    def _start(self) -> None:
        self._starts += 1
        socket = self._directory / f"host-{self._starts}.sock"
        environment = {name: value for name, value in os.environ.items()
                       if name not in {"CODEMODE_HOST_PARENT", "CODEMODE_HOST_TOKEN"}}  # fmt: skip
        environment["CODEMODE_HOST_PARENT"] = str(os.getpid())
        with self._log.open("ab") as log:
            process = subprocess.Popen(
                host_command("--listen", f"unix:{socket}"),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                env=environment,
            )
        self._process = process
        _SHARED_PIDS.add(process.pid)
        assert process.stdout is not None
        line = _read_line_within(process.stdout.fileno(), STOP_BOUND)
        process.stdout.close()
        if not line.startswith(PREFIX):
            self.close()
            raise AssertionError(f"the shared host did not listen: {line!r}\n{self.log()}")
        self._address = line[len(PREFIX) :].decode().strip()

    def close(self) -> None:
        """Stop the host (SIGTERM, then SIGKILL after a bound) and reap it."""
        process = self._process
        if process is None:
            return
        self._process = None
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(STOP_BOUND)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        _SHARED_PIDS.discard(process.pid)


def _read_line_within(fd: int, seconds: float) -> bytes:
    """The first line on `fd` (or what came before its end), within `seconds`."""
    deadline = time.monotonic() + seconds
    data = b""
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 1)
        if not chunk:
            break
        data += chunk
    return data
