"""Starting the host program: its command line and the child process.

The child gets piped stdin, stdout and stderr and its own session (so terminal signals to the
application's process group do not reach it); its stderr is forwarded line by line to the
`codemode.host` logger.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Sequence

import trio

from ..errors import CodeModeError

logger = logging.getLogger("codemode.host")


def default_host_command() -> list[str]:
    """The argv that starts the host installed with this codemode."""
    return [sys.executable, "-m", "codemode_host"]


async def spawn_host(command: Sequence[str]) -> trio.Process:
    """Start the host program.

    Raises:
        CodeModeError: `failed to spawn code-mode host <program>: <os error>`.
    """
    try:
        return await trio.lowlevel.open_process(
            list(command),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as error:
        raise CodeModeError(f"failed to spawn code-mode host {command[0]}: {error}") from error


async def forward_stderr(stream: trio.abc.ReceiveStream) -> None:
    """Log each line the host writes to stderr, until it closes."""
    pending = b""
    async with stream:
        while chunk := await stream.receive_some(65536):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                logger.warning("code-mode host stderr: %s", line.decode(errors="replace"))
    if pending:
        logger.warning("code-mode host stderr: %s", pending.decode(errors="replace"))
