"""Delegate calls of one cell (its tool calls, or its notifications) as cancellable calls, run
by parked worker tasks.

Shared by the runtime (calls into the application) and the process provider (calls the host
forwards to the application).

A `CallbackGroup` holds one cell's calls; `CallWorkers` runs them, in the tasks of a borrowed
nursery (the in-process provider's, the host's, or the host link's). Each worker task runs one
call at a time inside a cancel scope of its own, and parks between calls until the next one is
handed to it. So the group can cancel one call, or all of them, without owning a nursery: a
cell that ends waits for its calls to return *or* for a grace period (`wait_idle()` under a
timeout), whichever comes first, and a delegate that shields its cleanup cannot hold the cell
hostage (design.md, design 4). A worker left running past the grace still belongs to the nursery,
which awaits it.

`all_started()` waits until every call started so far has begun: its worker has taken it to the
delegate's first checkpoint, so the delegate has seen the call (a pending frontier is delivered
only then).

Rules:
1. A call costs the wake-up of a parked worker, not a spawned task (about 12,000 instructions
   more in this interpreter) and a cancel scope of its own (about 48,000): a quarter of the
   client's work per nested tool call (`docs/performance-history.md`, eighth round). A worker
   is spawned only when none is parked.
2. Cancelling a call cancels its worker's scope, so that worker ends after the call (its scope
   stays cancelled) instead of parking: cancellation costs a spawn later, never a late cancel of
   another call. A call cancelled before its worker took it is cancelled as soon as it is taken,
   so the delegate sees it and meets `Cancelled` at its first checkpoint, as a task started in a
   cancelled scope would. Nothing else cancels a worker's scope but a job's own stop: the
   link's reading (rule 7) cancels the scope of the worker holding it, to end its read. Both
   go through `Worker.cancel`, so the worker knows without asking its scope.
3. At most `keep` workers park; a worker finishing a call when that many are parked ends. After
   `close()` none parks: those parked end, and busy ones end after their call.
4. Every worker starts in a copy of the context `CallWorkers` was made in (`contextvars`), not
   in the context of whoever's call made it start (a held call is started by the observer's
   caller). A call runs in its worker's context: a context variable a delegate sets and never
   resets is seen by that worker's later calls.
5. Workers run with trio's KeyboardInterrupt protection, which the delegate's code inherits: a
   real Ctrl-C is delivered to the main task, never raised inside a delegate call, so whatever
   a call raises is that call's failure (`contained`). The worker's loop is in
   `_worker_task.py`, which stays interpreted when the build compiles this module: the
   protection marks a function's code object, which a compiled function has not.
6. A parked worker keeps nothing of its last call, but its own frames keep pymalloc arenas from
   being given back: an owner that gives memory back when idle drops its parked workers first
   (`dismiss_parked`; the host does, before its engine's release when idle).
7. A worker runs jobs (`Job`): a call, or a role that moves from worker to worker, such as a host
   link's reading (`_wire/_stream.py`). A job may run calls in its own task, inline
   (`DelegateCall.run_inline`), under a `FirstSuspension` of its own: `suspending()` is called
   when one of them first suspends, before the task parks, so the job can hand the rest of its
   work on to another worker, and that task then runs the call to its end. A call that returns
   without suspending costs no other task and no pass of the scheduler (a host link's tool
   call, `docs/benchmarks.md`). One `FirstSuspension` serves all the calls a job runs in a row:
   the `StopIteration` it catches when they return cost about 4,500 instructions compiled, paid
   once a batch, not once a call.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Final, TypeVarTuple

import trio

from ._worker_task import work

Ts = TypeVarTuple("Ts")

# `Final`: C statics in the compiled build, where `trio.lowlevel.reschedule` is a lookup of
# `trio` and two attribute reads for every call handed to a worker.
_reschedule: Final = trio.lowlevel.reschedule
_wait_task_rescheduled: Final = trio.lowlevel.wait_task_rescheduled

CLEANUP_GRACE = 1.0
"""Seconds a closing cell waits for its cancelled delegate calls (design.md, design 4)."""


class Worker:
    """A task that runs jobs one at a time (rule 1), each in its cancel scope `scope`, which
    only `cancel` cancels (rule 2)."""

    __slots__ = ("cancelled", "next", "scope", "task")

    def __init__(self, task: trio.lowlevel.Task, scope: trio.CancelScope) -> None:
        self.task = task
        self.scope = scope
        self.next: Job | None = None  # handed over while it is parked
        self.cancelled = False
        """True once `cancel` was called: read after every job, where the scope's
        `cancel_called` costs a reading of trio's clock (it checks the deadline)."""

    def cancel(self, reason: str | None = None) -> None:
        """Cancel the worker's scope: its job meets `Cancelled`, and the worker then ends."""
        self.cancelled = True
        self.scope.cancel(reason=reason)


class Job:
    """What a worker runs (rule 7): a `DelegateCall`, or a role of a task."""

    __slots__ = ()

    async def run(self, worker: Worker) -> None:
        """Run in `worker`'s task, in its scope."""
        raise NotImplementedError


class CallWorkers:
    """Worker tasks of one nursery, which run the calls of many `CallbackGroup`s.

    Args:
        nursery: where the workers run; it must outlive every call (its owner cancels it at
            its end, or calls `close()` first).
        keep: the most workers parked at once (rule 3).
    """

    def __init__(self, nursery: trio.Nursery, *, keep: int) -> None:
        self._nursery = nursery
        self._keep = keep
        self._context = contextvars.copy_context()  # rule 4
        self._parked: list[Worker] = []
        self._closed = False

    @property
    def context(self) -> contextvars.Context:
        """The context every worker starts in a copy of (rule 4)."""
        return self._context

    @property
    def parked(self) -> int:
        """Workers waiting for a call."""
        return len(self._parked)

    def run(self, job: Job) -> None:
        """Hand `job` to a parked worker, or to a new one.

        Raises:
            RuntimeError: no worker was parked and the nursery is closed.
        """
        if self._parked:
            worker = self._parked.pop()
            worker.next = job
            _reschedule(worker.task)
        else:
            # The new task copies the context current when it is spawned (rule 4).
            self._context.run(self._nursery.start_soon, work, self, job)

    def close(self) -> None:
        """No worker parks from now on (rule 3); the parked ones end."""
        self._closed = True
        self.dismiss_parked()

    def dismiss_parked(self) -> None:
        """The parked workers end (rule 6); later calls start new ones."""
        parked, self._parked = self._parked, []
        for worker in parked:
            _reschedule(worker.task)  # with no call: it ends

    def enlist(self, task: trio.lowlevel.Task, scope: trio.CancelScope) -> Worker:
        """A new worker: `task`, which runs its calls in `scope` (`_worker_task.work`)."""
        return Worker(task, scope)

    def keeps(self, worker: Worker) -> bool:
        """Whether `worker`, done with a call, parks for the next (rule 2, rule 3)."""
        return not (worker.cancelled or self._closed or len(self._parked) >= self._keep)

    async def park(self, worker: Worker) -> Job | None:
        self._parked.append(worker)

        def abort(_: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
            self._parked.remove(worker)  # the nursery is cancelled: the worker ends
            return trio.lowlevel.Abort.SUCCEEDED

        await _wait_task_rescheduled(abort)
        job, worker.next = worker.next, None
        return job


class DelegateCall(Job):
    """One call of a `CallbackGroup`: cancel it with `cancel()`."""

    __slots__ = ("_args", "_cancelled", "_fn", "_group", "_reason", "_worker")

    def __init__(
        self,
        group: CallbackGroup,
        fn: Callable[..., Coroutine[Any, Any, object]],
        args: tuple[Any, ...],
    ) -> None:
        self._group = group
        self._fn = fn
        self._args = args
        self._worker: Worker | None = None  # while a worker runs it
        self._cancelled = False
        self._reason: str | None = None

    def cancel(self, reason: str | None = None) -> None:
        """Cancel the call (rule 2); nothing if it already returned."""
        if self._cancelled:
            return
        self._cancelled = True
        self._reason = reason
        if self._worker is not None:
            self._worker.cancel(reason)

    @property
    def cancelled(self) -> bool:
        """Whether `cancel()` was called (a call not yet begun then goes to a worker: rule 2)."""
        return self._cancelled

    async def run_inline(self, worker: Worker) -> None:
        """Run the call now, in `worker`'s task, the one running this, whose job watches for
        its first suspension (`FirstSuspension`, rule 7). Not for a cancelled call."""
        self._group._started_one()
        self._worker = worker
        try:
            await self._fn(*self._args)
        finally:
            self._worker = None
            self._group._finished(self)

    async def run(self, worker: Worker) -> None:
        # The waiter of `all_started` runs after this step, which takes `fn` to its first
        # checkpoint: by then the delegate has the call.
        self._group._started_one()
        self._worker = worker
        if self._cancelled:
            worker.cancel(self._reason)
        try:
            await self._fn(*self._args)
        finally:
            self._worker = None
            self._group._finished(self)


class FirstSuspension:
    """Awaits `coroutine`, and calls `suspending()` the first time it suspends (rule 7).

    trio resumes a task by sending into its coroutine, so after the first suspension this only
    passes along what the coroutine yields to trio and what trio sends (or throws) back.
    """

    __slots__ = ("_coroutine", "_suspending")

    def __init__(
        self, coroutine: Coroutine[Any, Any, object], suspending: Callable[[], None]
    ) -> None:
        self._coroutine = coroutine
        self._suspending = suspending

    def __await__(self) -> Generator[Any, Any, object]:
        coroutine = self._coroutine
        try:
            trap = coroutine.send(None)
        except StopIteration as done:
            return done.value
        self._suspending()
        while True:
            try:
                sent = yield trap
            except GeneratorExit:
                coroutine.close()
                raise
            except BaseException as thrown:
                try:
                    trap = coroutine.throw(thrown)
                except StopIteration as done:
                    return done.value
            else:
                try:
                    trap = coroutine.send(sent)
                except StopIteration as done:
                    return done.value


class CallbackGroup:
    """The calls of one cell, run by `workers`, which the group can cancel and wait for."""

    def __init__(self, workers: CallWorkers) -> None:
        self._workers = workers
        self._calls: set[DelegateCall] = set()
        self._unstarted = 0
        # Made by the first waiter that has to wait, not per call: two events a call showed in
        # profiles of both ends, and most groups are never waited on while busy.
        self._idle: trio.Event | None = None
        self._started: trio.Event | None = None

    def start(self, fn: Callable[[*Ts], Coroutine[Any, Any, object]], *args: *Ts) -> DelegateCall:
        """Run `fn(*args)` in a worker; returns the call, to cancel it."""
        call = self.prepare(fn, *args)
        self._workers.run(call)
        return call

    def prepare(self, fn: Callable[[*Ts], Coroutine[Any, Any, object]], *args: *Ts) -> DelegateCall:
        """The call of `fn(*args)`, started but not yet run: its caller runs it soon, inline or
        in a worker (rule 7)."""
        call = DelegateCall(self, fn, args)
        self._calls.add(call)
        self._unstarted += 1
        return call

    def _started_one(self) -> None:
        self._unstarted -= 1
        if not self._unstarted and self._started is not None:
            self._started.set()
            self._started = None

    def _finished(self, call: DelegateCall) -> None:
        self._calls.discard(call)
        if not self._calls and self._idle is not None:
            self._idle.set()
            self._idle = None

    @property
    def idle(self) -> bool:
        """No call of the group runs (`wait_idle()` would only checkpoint)."""
        return not self._calls

    @property
    def all_running(self) -> bool:
        """Every call started so far has begun running (`all_started()` would only
        checkpoint)."""
        return not self._unstarted

    def cancel(self, reason: str) -> None:
        """Cancel every call of the group (one not yet begun is cancelled as it begins)."""
        for call in list(self._calls):
            call.cancel(reason)

    async def all_started(self) -> None:
        """Wait until every call started so far has begun running."""
        if not self._unstarted:
            await trio.lowlevel.checkpoint()
            return
        if self._started is None:
            self._started = trio.Event()
        await self._started.wait()

    async def wait_idle(self) -> None:
        """Wait until no call of the group runs (bound it with a cancel scope)."""
        if not self._calls:
            await trio.lowlevel.checkpoint()
            return
        if self._idle is None:
            self._idle = trio.Event()
        await self._idle.wait()
