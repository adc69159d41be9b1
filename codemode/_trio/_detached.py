"""A nursery whose owner may leave while some of its tasks still run: where the application's
delegate calls run.

A delegate call that ignores cancellation (`await trio.to_thread.run_sync(blocking)` in an
async tool: trio waits for the thread) would hold any nursery it runs in open until it returns.
Leaving a provider's block must not wait for it, so a provider's calls run in a nursery of a
system task (`trio.lowlevel.spawn_system_task`) instead of its own.

Rules:
1. Leaving `open_detached_nursery` cancels the nursery and waits for its tasks for at most
   `bound` seconds (shielded). Tasks still running then are left behind and logged (logger
   `codemode`, WARNING); each ends when its call returns, at the latest when the trio run ends
   (which waits for them, as for any system task).
2. The tasks must not raise (a system task that fails ends the trio run): the delegate call
   workers contain everything but their own cancellation (`contained`); anything else that
   reaches the host task is logged, never raised.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from ._containment import cancellation

logger = logging.getLogger("codemode")


class _Host:
    """The system task that holds the nursery."""

    def __init__(self) -> None:
        self.nursery: trio.Nursery | None = None
        self.ready = trio.Event()
        self.done = trio.Event()

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                self.ready.set()
                await trio.sleep_forever()
        except BaseException as error:  # rule 2: never out of a system task
            if not cancellation(error):
                logger.error("a delegate call task failed", exc_info=error)
        finally:
            self.done.set()


@asynccontextmanager
async def open_detached_nursery(*, bound: float) -> AsyncIterator[trio.Nursery]:
    """A nursery that lives in a system task; leaving the block waits for its tasks for at most
    `bound` seconds (rule 1)."""
    host = _Host()
    trio.lowlevel.spawn_system_task(host.run, context=contextvars.copy_context())
    await host.ready.wait()
    assert host.nursery is not None
    nursery = host.nursery
    try:
        yield nursery
    finally:
        nursery.cancel_scope.cancel()
        with trio.CancelScope(shield=True), trio.move_on_after(bound):
            await host.done.wait()
        if not host.done.is_set():
            logger.warning(
                "left %d delegate calls behind that did not return %s s after they were"
                " cancelled (they run on until they return)",
                len(nursery.child_tasks),
                bound,
            )
