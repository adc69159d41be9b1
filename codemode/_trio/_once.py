"""A job run once, as a task of a nursery, that every caller awaits to its end.

Both providers run a session's shutdown this way: cancelling a caller does not stop the job,
a later caller waits for the same end, and an error of the job reaches every caller (a task of
the provider's nursery must not raise: it would tear the provider down).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio


class RunOnce:
    """Starts its job on the first `run`; every `run` returns when the job ended."""

    __slots__ = ("_done", "_error")

    def __init__(self) -> None:
        self._done: trio.Event | None = None
        self._error: Exception | None = None

    @property
    def started(self) -> bool:
        return self._done is not None

    async def run(self, nursery: trio.Nursery, job: Callable[[], Awaitable[None]]) -> None:
        """Start `job` in `nursery` if it was not started, then wait for its end.

        Raises:
            Exception: what the job raised (every caller sees it).
        """
        if self._done is None:
            self._done = trio.Event()
            nursery.start_soon(self._run, job, self._done)
        await self._done.wait()
        if self._error is not None:
            raise self._error

    async def _run(self, job: Callable[[], Awaitable[None]], done: trio.Event) -> None:
        try:
            await job()
        except Exception as error:  # for the callers, not for the nursery
            self._error = error
        finally:
            done.set()
