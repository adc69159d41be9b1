"""Starting the host program: its command line, the child process, and its stderr.

The child gets piped stdin, stdout and stderr and its own session (so terminal signals to the
application's process group do not reach it). Its stderr is read from the moment it is spawned
(a host that writes more than a pipe's worth before the handshake must not block): each line is
logged to the `codemode.host` logger, and the last lines are kept so that a host that fails to
start, or dies, can say why.
"""

from __future__ import annotations

import collections
import logging
import os
import subprocess
import sys
from collections.abc import Sequence

import trio

from ..errors import HostLostError

logger = logging.getLogger("codemode.host")

PARENT_VARIABLE = "CODEMODE_HOST_PARENT"
TAIL_LINES = 20
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
        return await trio.lowlevel.open_process(
            list(command),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            # The host dies with this process (it watches it through a pidfd).
            env={**os.environ, PARENT_VARIABLE: str(os.getpid())},
        )
    except OSError as error:
        raise HostLostError(f"failed to spawn code-mode host {command[0]}: {error}") from error


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
