"""The threads plain (sync) tools run in: a capacity limiter of codemode's own per provider, and
the count of threads abandoned by cancelled calls.

Python cannot stop a thread. A sync tool blocked on a network read keeps its thread after its
cell ended, and trio keeps the limiter token of an abandoned thread until the thread returns:
on trio's default limiter (40 tokens, shared with the application's `getaddrinfo`, anyio's
`to_thread` and image preparation) forty such calls stopped every thread of the process.

Rules:
1. A provider's sync tools run on its own `ToolThreads` (`max_running` at once; more wait for a
   thread), never on trio's default limiter. A provider's delegate calls find theirs through a
   context variable set in its call workers' context (`tool_threads_here`); code outside any
   provider (a test calling a toolbox itself) shares one per trio run.
2. A call cancelled while its thread runs abandons the thread: the call returns at once, its
   token goes back at once (so abandoned threads never starve live calls), and the thread
   counts as abandoned until it returns. Each abandonment is logged.
3. While `max_abandoned` threads are abandoned, a new call fails at once with
   `abandoned_text(...)` instead of taking another thread.
4. A delegate that `codemode.aio` runs on the asyncio loop finds the provider's threads the same
   way (its task's context is a copy of the call worker's), and reaches them through the
   portal that `codemode.aio` put in that context (`use_trio_portal`): the thread is still
   the provider's, abandoned on cancel as above.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import trio

from ._limits import ToolThreadLimits, ToolThreadStatistics
from .errors import ToolError

logger = logging.getLogger("codemode.toolbox")

T = TypeVar("T")


def abandoned_text(tool_name: str, abandoned: int, limit: int) -> str:
    """The rejection text of a sync tool call refused by rule 3."""
    return (
        f"tool {tool_name} was not run: {abandoned} threads of cancelled tool calls are still"
        f" running (the limit is {limit})"
    )


class ToolThreads:
    """The threads one provider's sync tools run in (rules 1-3)."""

    def __init__(self, limits: ToolThreadLimits | None = None) -> None:
        self.limits = limits or ToolThreadLimits()
        self._limiter = trio.CapacityLimiter(self.limits.max_running)
        self.abandoned = 0

    def statistics(self) -> ToolThreadStatistics:
        stats = self._limiter.statistics()
        return ToolThreadStatistics(
            running=stats.borrowed_tokens,
            waiting=stats.tasks_waiting,
            abandoned=self.abandoned,
            limits=self.limits,
        )

    async def run(self, tool_name: str, function: Callable[[], T]) -> T:
        """Run `function` in a thread of this provider; cancelled, the thread is abandoned.

        Raises:
            ToolError: `max_abandoned` threads are abandoned (rule 3).
        """
        if self.abandoned >= self.limits.max_abandoned:
            raise ToolError(abandoned_text(tool_name, self.abandoned, self.limits.max_abandoned))
        token = _CallToken(self)
        limiter = cast(trio.CapacityLimiter, token)  # trio takes any object with its two methods
        try:
            return await trio.to_thread.run_sync(function, abandon_on_cancel=True, limiter=limiter)
        except trio.Cancelled:
            if token.holds:
                token.abandon()
                logger.warning(
                    "abandoned the thread of sync tool %s: its call was cancelled while it ran"
                    " (%d abandoned threads still run)",
                    tool_name,
                    self.abandoned,
                )
            raise

    def _returned(self) -> None:
        self.abandoned -= 1


class _CallToken:
    """The limiter trio's `to_thread` sees for one call: it borrows the provider's token, and
    gives it back early when the call abandons its thread (rule 2)."""

    __slots__ = ("_borrower", "_threads", "holds")

    def __init__(self, threads: ToolThreads) -> None:
        self._threads = threads
        self._borrower: object = None
        self.holds = False  # a thread runs on the provider's token

    async def acquire_on_behalf_of(self, borrower: object) -> None:
        await self._threads._limiter.acquire_on_behalf_of(borrower)
        self._borrower = borrower
        self.holds = True

    def release_on_behalf_of(self, borrower: object) -> None:
        if self.holds:
            self.holds = False
            self._threads._limiter.release_on_behalf_of(borrower)
        else:  # the thread of an abandoned call returned
            self._threads._returned()

    def abandon(self) -> None:
        self.holds = False
        self._threads._limiter.release_on_behalf_of(self._borrower)
        self._threads.abandoned += 1


_here: contextvars.ContextVar[ToolThreads] = contextvars.ContextVar("codemode_tool_threads")
_run_wide: trio.lowlevel.RunVar[ToolThreads] = trio.lowlevel.RunVar("codemode_tool_threads")


def tool_threads_here() -> ToolThreads:
    """The `ToolThreads` of the provider whose call runs now, or the trio run's (rule 1)."""
    threads = _here.get(None)
    if threads is not None:
        return threads
    try:
        return _run_wide.get()
    except LookupError:
        threads = ToolThreads()
        _run_wide.set(threads)
        return threads


def use_tool_threads(context: contextvars.Context, threads: ToolThreads) -> None:
    """Make `threads` the ones the calls run in `context` use (rule 1)."""
    context.run(_here.set, threads)


TrioPortal = Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]]
"""Runs an async function of no arguments as a trio task, from an asyncio task (rule 4)."""

_portal: contextvars.ContextVar[TrioPortal] = contextvars.ContextVar("codemode_trio_portal")


def use_trio_portal(context: contextvars.Context, portal: TrioPortal) -> None:
    """Make the sync tools of the delegate calls run in `context` reach trio through `portal`."""
    context.run(_portal.set, portal)


async def run_in_tool_thread(tool_name: str, function: Callable[[], T]) -> T:
    """Run a sync tool (or a plain `on_notify`) in a thread of the provider whose call runs now:
    from a trio task (rule 1), or from an asyncio task of `codemode.aio` (rule 4)."""
    threads = _here.get(None)
    portal = _portal.get(None)

    async def run() -> T:
        return await (threads or tool_threads_here()).run(tool_name, function)

    if portal is None:
        return await run()
    return cast(T, await portal(run))
