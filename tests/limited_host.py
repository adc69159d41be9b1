"""A host that offers no capabilities, as an older host would: `python tests/limited_host.py`
(or only those named after it: `python tests/limited_host.py session-cell-execution-resource-limits`).

Tests start it as a process provider's host command to check what the client does when the
host lacks a capability.
"""

from __future__ import annotations

import os
import sys

import trio
from codemode_host.server import serve_connection


async def _serve() -> int:
    receive = trio.lowlevel.FdStream(os.dup(0))
    send = trio.lowlevel.FdStream(os.dup(1))
    async with receive, send:
        return await serve_connection(receive, send, capabilities=sys.argv[1:])


if __name__ == "__main__":
    sys.exit(trio.run(_serve))
