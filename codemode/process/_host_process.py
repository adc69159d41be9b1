"""Starting the host program: its command line, the child process, and its stderr.

The child gets piped stdin, stdout and stderr (stdin and stdout with a megabyte of room each,
where the system allows) and its own process group (so terminal signals to the application's
process group do not reach it), in the application's session. Its stderr is read from the
moment it is spawned (a host that writes more than a pipe's worth before the handshake must not
block): each line is logged to the `codemode.host` logger, and the last lines are kept so that
a host that fails to start, or dies, can say why. `SpawnedHost` is the `HostTransport` of a
spawned host: the process's pipes, its supervision, and its reaping.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Sequence

import trio

from .._wire import DRAIN_TIMEOUT, PARENT_VARIABLE, HostTransport
from ..errors import HostLostError

logger = logging.getLogger("codemode.host")

TAIL_LINES = 20
PIPE_BYTES = 1 << 20
"""Room of the host's stdin and stdout pipes (Linux's default limit for an unprivileged user)."""
TAIL_LINE_CHARS = 500


def default_host_command() -> list[str]:
    """The argv that starts the host installed with this codemode."""
    return [sys.executable, "-m", "codemode_host"]


async def spawn_host(command: Sequence[str]) -> trio.Process:
    """Start the host program.

    Raises:
        HostLostError: `failed to spawn code-mode host <program>: <os error>`.
    """
    try:
        process = await trio.lowlevel.open_process(
            list(command),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            # Not a session of its own: under the kernel's autogroup scheduling each session
            # is a scheduling group, and a host in its own competed with the application as a
            # whole, which made its engine workers preempted more often and a cell's CPU vary
            # by a fifth between seconds at 64 sessions (docs/benchmarks.md, "One frame fewer
            # a cell, and the host's scheduling group").
            process_group=0,
            # The host dies with this process (it watches it through a pidfd).
            env={**os.environ, PARENT_VARIABLE: str(os.getpid())},
        )
    except OSError as error:
        raise HostLostError(f"failed to spawn code-mode host {command[0]}: {error}") from error
    for pipe in (process.stdin, process.stdout):
        assert isinstance(pipe, trio.lowlevel.FdStream)
        _enlarge(pipe.fileno())
    return process


def _enlarge(fd: int) -> None:
    """Give a pipe `PIPE_BYTES` of room (best effort): a 16 MiB tool result then crosses in 16
    writes and wake-ups instead of 256."""
    with contextlib.suppress(OSError, AttributeError):  # no F_SETPIPE_SZ: not Linux
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)


class StderrTail:
    """The host's stderr: forwarded to the log line by line, its last lines kept."""

    def __init__(self) -> None:
        self._lines: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.closed = trio.Event()

    def text(self) -> str:
        """The last lines, joined (empty if the host wrote nothing)."""
        return "\n".join(self._lines)

    def describe(self, reason: str) -> str:
        """`reason`, followed by the host's last stderr lines if there are any."""
        tail = self.text()
        return f"{reason}; its stderr ended with:\n{tail}" if tail else reason

    def _add(self, raw: bytes) -> None:
        line = raw.decode(errors="replace").rstrip("\r")
        logger.warning("code-mode host stderr: %s", line)
        self._lines.append(line[:TAIL_LINE_CHARS])

    async def forward(self, stream: trio.abc.ReceiveStream) -> None:
        """Read `stream` until it closes (the host exited)."""
        pending = b""
        try:
            async with stream:
                while chunk := await stream.receive_some(65536):
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        self._add(line)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
            logger.debug("reading the code-mode host's stderr failed: %s", error)
        finally:
            if pending:
                self._add(pending)
            self.closed.set()


class SpawnedHost(HostTransport):
    """A host program started as a child process, spoken to over its stdin and stdout."""

    def __init__(self, command: Sequence[str]) -> None:
        self._command = list(command)
        self._stderr = StderrTail()
        self._process: trio.Process | None = None

    async def open(self) -> tuple[trio.abc.SendStream, trio.abc.ReceiveStream]:
        self._process = process = await spawn_host(self._command)
        assert process.stdin is not None
        assert process.stdout is not None
        return process.stdin, process.stdout

    def start(
        self, nursery: trio.Nursery, lost: Callable[[str], None], read_done: trio.Event
    ) -> None:
        process = self._process
        assert process is not None
        assert process.stderr is not None
        nursery.start_soon(self._stderr.forward, process.stderr)
        nursery.start_soon(self._supervise, process, lost, read_done)

    @staticmethod
    async def _supervise(
        process: trio.Process, lost: Callable[[str], None], read_done: trio.Event
    ) -> None:
        status = await process.wait()
        with trio.move_on_after(DRAIN_TIMEOUT):
            await read_done.wait()  # rule 2 of `codemode._wire._link_core`
        lost(f"code-mode host exited with status {status}")

    def exit_status(self) -> int | None:
        return None if self._process is None else self._process.returncode

    @property
    def pid(self) -> int | None:
        """The host process's id (None before it was spawned)."""
        return None if self._process is None else self._process.pid

    def describe(self, reason: str) -> str:
        return self._stderr.describe(reason)

    async def last_words(self) -> None:
        await self._stderr.closed.wait()

    def kill(self) -> None:
        if self._process is not None and self._process.returncode is None:
            self._process.kill()

    async def close(self) -> None:
        """Close the host's stdin and wait for it to exit."""
        process = self._process
        if process is not None and process.stdin is not None:
            await process.stdin.aclose()
            await process.wait()

    async def ended(self) -> str:
        process = self._process
        assert process is not None
        with trio.move_on_after(DRAIN_TIMEOUT):
            status = await process.wait()
            return f"code-mode host exited with status {status}"
        return self.closed_text

    async def reap(self) -> None:
        """Kill the process if it still runs, close its pipes and wait for it (no zombie, no
        fd)."""
        process = self._process
        if process is None:
            return
        if process.returncode is None:
            process.kill()
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:
                await stream.aclose()
        await process.wait()
