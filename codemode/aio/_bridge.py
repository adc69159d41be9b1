"""The trio run `codemode.aio` hosts on an asyncio loop (trio's guest mode), and the two ways
across it.

Rules:
1. One guest run per asyncio loop (trio allows one run per thread): the first `Bridge` user on a
   loop starts it, the last one to leave ends it and waits for its end; a user that arrives
   while a run ends waits for that end and starts the next run. Trio keeps its own I/O-wait
   thread; the application's loop needs none of its own.
2. asyncio to trio (`Bridge.call`): the function runs as a task of the run's nursery.
   Cancelling the asyncio caller cancels that task and waits for its end (further cancellations
   meanwhile are absorbed), then raises `CancelledError`, as a trio caller would see its
   operation end before its `Cancelled`. If the task had finished first, the caller never saw
   its result: `orphan` gets it (a cell to terminate, a response to keep for the next
   observer) and the clean-up it returns is awaited, uncancellably, before the
   `CancelledError` is raised.
3. trio to asyncio (`Bridge.run_asyncio`): a coroutine of the application runs as an asyncio task,
   in a copy of the calling trio task's context, with the trio portal of `_tool_threads` (rule
   4) in it. Cancelling the trio caller cancels the asyncio task and waits for its end,
   shielded, as a trio delegate's own clean-up would run (the provider bounds it with its
   cleanup grace); what the task raises is re-raised as it is.
4. Neither side polls: each wakes the other through its own queue (`loop.call_soon_threadsafe`
   for asyncio, `TrioToken.run_sync_soon` for trio), in the order the calls were made.
"""

from __future__ import annotations

import asyncio
import contextvars
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, TypeVar

import outcome
import trio

from .._tool_threads import use_trio_portal

T = TypeVar("T")

Orphan = Callable[[T], "asyncio.Future[Any] | None"]
"""What to do with a result its cancelled caller never saw (rule 2): returns the clean-up to
await, if any."""


class BridgeClosedError(RuntimeError):
    """The guest run ended while a call still ran in it (its providers were all closed)."""


async def until_done(future: asyncio.Future[Any]) -> None:
    """Wait for `future` to finish, whatever cancellations the caller receives meanwhile."""
    while not future.done():
        try:
            await asyncio.wait([future])
        except asyncio.CancelledError:
            continue


class Bridge:
    """A trio guest run on one asyncio loop (rule 1). Made by `open_bridge` only."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.users = 0
        self.closing = False
        self.finished: asyncio.Future[None] = loop.create_future()
        self._nursery: trio.Nursery | None = None
        self._early: list[Callable[[trio.Nursery], None]] = []
        self._stop = trio.Event()
        trio.lowlevel.start_guest_run(
            self._main,
            run_sync_soon_threadsafe=loop.call_soon_threadsafe,
            run_sync_soon_not_threadsafe=loop.call_soon,
            done_callback=self._done,
            # asyncio's loop owns the wakeup fd (its signal handlers): trio leaves it alone.
            host_uses_signal_set_wakeup_fd=True,
        )
        self.token = trio.lowlevel.current_trio_token()

    async def _main(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for start in self._early:
                start(nursery)
            self._early.clear()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    def _done(self, result: outcome.Outcome[None]) -> None:
        if _bridges.get(self.loop) is self:
            del _bridges[self.loop]
        if isinstance(result, outcome.Error):
            self.finished.set_exception(result.error)
        else:
            self.finished.set_result(None)

    def soon(self, function: Callable[[], object]) -> None:
        """Run a sync function in the trio run, after what was already asked of it (rule 4)."""
        try:
            self.token.run_sync_soon(function)
        except trio.RunFinishedError:
            pass  # the run is over: nothing of it is left to act on

    def _start(self, job: Callable[[], Awaitable[None]]) -> None:
        def start(nursery: trio.Nursery) -> None:
            nursery.start_soon(job)

        def now() -> None:
            if self._nursery is None:
                self._early.append(start)
            else:
                start(self._nursery)

        self.soon(now)

    def submit(
        self,
        function: Callable[..., Awaitable[T]],
        *args: Any,
        scope: trio.CancelScope | None = None,
    ) -> asyncio.Future[T]:
        """Start `function(*args)` as a trio task; its outcome goes to the returned future."""
        future: asyncio.Future[T] = self.loop.create_future()
        scope = scope or trio.CancelScope()

        async def job() -> None:
            try:
                with scope:
                    future.set_result(await function(*args))
                    return
                future.set_exception(BridgeClosedError("the trio run of codemode.aio ended"))
            except BaseException as error:  # the caller's to see, not the nursery's
                future.set_exception(error)

        self._start(job)
        return future

    async def call(
        self, function: Callable[..., Awaitable[T]], *args: Any, orphan: Orphan[T] | None = None
    ) -> T:
        """Run `function(*args)` in the trio run and return its result (rule 2)."""
        scope = trio.CancelScope()
        future = self.submit(function, *args, scope=scope)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            if not future.done():
                self.soon(scope.cancel)
            await until_done(future)
            if future.exception() is None and orphan is not None:
                cleanup = orphan(future.result())
                if cleanup is not None:
                    await until_done(cleanup)
                    cleanup.exception()  # retrieved: a failed clean-up leaves nothing to do
            raise

    async def run_asyncio(self, function: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
        """From a trio task: run `function(*args)` as an asyncio task and return its result
        (rule 3)."""
        context = contextvars.copy_context()
        use_trio_portal(context, self.call)
        task = self.loop.create_task(function(*args), context=context)
        done = trio.Event()
        task.add_done_callback(lambda _: self.soon(done.set))
        try:
            await done.wait()
        except trio.Cancelled:
            task.cancel()
            with trio.CancelScope(shield=True):
                await done.wait()
            if not task.cancelled():
                task.exception()  # retrieved: the cancelled caller has no use for it
            raise
        return task.result()

    @asynccontextmanager
    async def hold(self, opener: Callable[[], AbstractAsyncContextManager[T]]) -> AsyncIterator[T]:
        """Enter a trio async context manager in one trio task and leave it in the same task
        when the asyncio block ends, the block's exception passed to its exit (cancelling the
        asyncio side as in rule 2)."""
        entered: asyncio.Future[T] = self.loop.create_future()
        exited: asyncio.Future[bool | None] = self.loop.create_future()
        # One scope around the manager's whole life, cancelled only while it is entered: its
        # own nurseries and scopes open inside it and close before it.
        scope = trio.CancelScope()
        entering = True
        leave = trio.Event()
        raised: list[BaseException | None] = []

        async def holder() -> None:
            nonlocal entering
            manager = opener()
            with scope:
                try:
                    value = await manager.__aenter__()
                except BaseException as error:
                    entered.set_exception(error)
                    return
                entering = False
                entered.set_result(value)
                await leave.wait()
                leaving = raised[0]
                try:
                    if leaving is None:
                        exited.set_result(await manager.__aexit__(None, None, None))
                    else:
                        exited.set_result(
                            await manager.__aexit__(type(leaving), leaving, leaving.__traceback__)
                        )
                except BaseException as exit_error:
                    exited.set_exception(exit_error)

        def cancel_entering() -> None:
            if entering:
                scope.cancel()

        def leave_with(error: BaseException | None) -> None:
            raised.append(error)
            self.soon(leave.set)

        self._start(holder)
        try:
            value = await asyncio.shield(entered)
        except asyncio.CancelledError as cancelled:
            if not entered.done():
                self.soon(cancel_entering)
            await until_done(entered)
            if entered.exception() is None:
                leave_with(cancelled)
                await until_done(exited)
                exited.exception()  # retrieved: the cancellation is what leaves
            raise
        try:
            yield value
        except BaseException as error:
            leave_with(error)
            await until_done(exited)
            if exited.result():
                return  # the trio manager suppressed it
            raise
        leave_with(None)
        await until_done(exited)
        exited.result()

    async def aclose(self) -> None:
        """End the run (its nursery cancelled) and wait for its end, uncancellably."""
        self.closing = True
        self.soon(self._stop.set)
        await until_done(self.finished)
        self.finished.result()


_bridges: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Bridge] = weakref.WeakKeyDictionary()


@asynccontextmanager
async def open_bridge() -> AsyncIterator[Bridge]:
    """The running loop's guest run, started on first use and ended after its last user
    (rule 1)."""
    loop = asyncio.get_running_loop()
    while True:
        bridge = _bridges.get(loop)
        if bridge is None:
            bridge = _bridges[loop] = Bridge(loop)
            break
        if not bridge.closing:
            break
        await asyncio.wait([bridge.finished])
    bridge.users += 1
    try:
        yield bridge
    finally:
        bridge.users -= 1
        if bridge.users == 0:
            await bridge.aclose()
