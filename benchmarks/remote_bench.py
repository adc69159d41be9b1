"""Remote provider figures: the process provider (a spawned host on pipes) as the baseline, and
the remote provider on a listening host over loopback TCP and over a Unix socket, measured in
the same run by `measure` (execute -> initial response of `text(1)` and of a one-tool cell, and
cells per second with 64 sessions).

Run: `python -m benchmarks.remote_bench`.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from typing import Any

import trio

import codemode
from benchmarks._cells import Delegate, run_cell, timed_cell
from codemode import Session

ONE_TOOL = "text(JSON.stringify(await tools.echo({})))"


def ms(seconds: float) -> str:
    return f"{seconds * 1000:7.3f} ms"


async def measure(
    open_provider: Callable[[], AbstractAsyncContextManager[Any]],
) -> dict[str, float]:
    """Medians of execute -> response (trivial, one tool) and cells/s with 64 sessions."""
    delegate = Delegate()
    async with open_provider() as provider:
        session = await provider.create_session()
        for _ in range(200):
            await run_cell(session, "text(1)", delegate)
        trivial = [await timed_cell(session, "text(1)", delegate) for _ in range(1000)]
        with_tool = [await timed_cell(session, ONE_TOOL, delegate, ["echo"]) for _ in range(1000)]
        sessions = [await provider.create_session() for _ in range(64)]
        total = 0
        start = time.perf_counter()

        async def drive(each: Session) -> None:
            nonlocal total
            for _ in range(50):
                await run_cell(each, ONE_TOOL, delegate, ["echo"])
                total += 1

        async with trio.open_nursery() as nursery:
            for each in sessions:
                nursery.start_soon(drive, each)
        rate = total / (time.perf_counter() - start)
    return {
        "trivial": statistics.median(trivial),
        "tool": statistics.median(with_tool),
        "rate": rate,
    }


PREFIX = b"codemode-host listening on "


@asynccontextmanager
async def listening(address: str) -> AsyncIterator[str]:
    """A `codemode-host --listen address` for the block; the address it printed."""
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "codemode_host", "--listen", address],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = b""
        while not line.endswith(b"\n"):
            chunk = await process.stdout.receive_some(1)
            if not chunk:
                raise RuntimeError(f"the host did not listen: {line!r}")
            line += chunk
        assert line.startswith(PREFIX), line
        yield line[len(PREFIX) :].decode().strip()
    finally:
        with trio.CancelScope(shield=True):
            process.terminate()
            await process.wait()
            await process.stdout.aclose()  # type: ignore[union-attr]


async def main() -> None:
    process = await measure(codemode.open_process_provider)
    figures = {"process (pipes)": process}
    async with listening("tcp://127.0.0.1:0") as tcp:
        figures["remote (TCP)"] = await measure(partial(codemode.open_remote_provider, [tcp]))
    with tempfile.TemporaryDirectory() as folder:
        async with listening(f"unix:{folder}/host.sock") as unix:
            figures["remote (unix)"] = await measure(partial(codemode.open_remote_provider, [unix]))
    for name, each in figures.items():
        print(
            f"{name:>16}: execute -> response {ms(each['trivial'])}"
            f"   with one tool call {ms(each['tool'])}"
            f"   64 sessions {each['rate']:7.0f} cells/s"
            f"   (x{each['rate'] / process['rate']:.2f} of pipes)"
        )


if __name__ == "__main__":
    trio.run(main)
