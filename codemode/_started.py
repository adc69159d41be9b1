"""`StartedCell`: a cell `Session.execute` admitted, its id now and its first response later.

The initial response is the cell's first observation and belongs to the `StartedCell` until it
is awaited or released (rule 5 of the runtime's `_cell`): see the class's docstring.
"""

from __future__ import annotations

import collections
import warnings
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import trio

    from ._api import CellId, RuntimeResponse


class StartedCell:
    """A cell that was admitted: its id now, its first response later.

    Made by `Session.execute` only. The initial response is the cell's first observation and
    belongs to this object until it is awaited (once) or released: `release()` (or leaving
    `async with started:`) gives it up without ending the cell, so the next `wait` observes
    the cell and gets the output the initial observation did not deliver; so does cancelling
    `initial_response()`. `execute(..., observe_initial=False)` returns it released already.
    Dropping it unreleased releases it too (its `__del__` only schedules the release on the
    provider's trio thread) but warns (`ResourceWarning`): when a reference cycle holds the
    object, the release waits for the garbage collector.
    """

    __slots__ = (
        "__weakref__",
        "_dropped",
        "_initial_response",
        "_release",
        "_session_id",
        "_settled",
        "_token",
        "cell_id",
    )

    cell_id: CellId
    _initial_response: Callable[[], Awaitable[RuntimeResponse]]
    _release: Callable[[], None]
    _settled: bool
    """True once the initial response was awaited or released: then dropping the object has
    nothing left to release."""
    _dropped: collections.deque[Callable[[], None]] | None
    _token: Any
    _session_id: str

    def __init__(self) -> None:
        raise TypeError("StartedCell has no public constructor: Session.execute makes it")

    @classmethod
    def _create(
        cls,
        cell_id: CellId,
        initial_response: Callable[[], Awaitable[RuntimeResponse]],
        release: Callable[[], None],
        dropped: collections.deque[Callable[[], None]] | None = None,
        *,
        session_id: str,
        observe_initial: bool = True,
        token: trio.lowlevel.TrioToken | None = None,
    ) -> StartedCell:
        """`dropped`: where `__del__` also puts `release`, for the session to run it before
        its next observation (`_release_dropped`). `session_id` names the session in the
        warning of a dropped cell. `observe_initial=False`: released at once. `token`: the
        current trio run's token, when the caller holds it already."""
        if token is None:
            import trio  # here: `import codemode` (the model layer) loads no trio

            token = trio.lowlevel.current_trio_token()
        started = object.__new__(cls)
        started.cell_id = cell_id
        started._initial_response = initial_response
        started._release = release
        started._settled = False
        started._dropped = dropped
        started._token = token
        started._session_id = session_id
        if not observe_initial:
            started.release()
        return started

    def __del__(self) -> None:
        # Not `weakref.finalize`: it kept a registry entry and a weak reference per cell, a
        # few percent of a trivial cell's instructions on the client. A `__del__` may run at
        # any point of any thread (PEP 442 collects a cycle that holds it): it only schedules
        # the release, and leaves it where the session's next observation runs it first.
        # Nothing to do once the initial response was taken or released: every cell drops
        # its StartedCell, and queueing their releases kept every cell alive (the soak).
        if getattr(self, "_settled", True):  # True also for `StartedCell()`, which raised
            return
        if self._dropped is not None:
            self._dropped.append(self._release)  # atomic: a deque needs no lock
        try:
            self._token.run_sync_soon(self._release)
        except RuntimeError:
            pass  # trio.RunFinishedError: the provider's trio run is over; so is the cell
        # Last: under an "error" filter the warning raises, and the release must be
        # scheduled by then. It warns because a drop is a release at the garbage
        # collector's timing when a cycle (a traceback, a closure) holds the object, and the
        # cell's next `wait` meets ObserverBusyError until then.
        warnings.warn(
            f"StartedCell of exec cell {self.cell_id!r} of session {self._session_id!r} was"
            " dropped without its initial response being awaited or released (it is"
            " released now). Await `started.initial_response()`, call `started.release()`,"
            " use `async with started:`, or pass `observe_initial=False` to `execute`",
            ResourceWarning,
            stacklevel=2,
            source=self,
        )

    @staticmethod
    def _release_dropped(dropped: collections.deque[Callable[[], None]]) -> None:
        """Run the releases of a session's `StartedCell`s dropped since the last call.

        A session calls it before an observation: the release `__del__` scheduled runs
        only at a later checkpoint, and a `wait` attaches its observer before its first
        checkpoint, so it found a dropped cell's initial observation still held
        (`ObserverBusyError`; `test_dropping_the_started_cell_frees_the_observer_slot` failed
        about one run in ten). Releases are idempotent: the scheduled one then does nothing.
        """
        while dropped:
            dropped.popleft()()

    async def initial_response(self) -> RuntimeResponse:
        """The first observation: Yielded, Completed or Terminated.

        Raises:
            ObserverBusyError: another observation of the cell is in progress.
            RuntimeEndedError: the cell went away without answering.
            CodeModeError: the initial response was already taken or released.
        """
        self._settled = True
        return await self._initial_response()

    def release(self) -> None:
        """Give the initial observation up without ending the cell (idempotent; no effect once
        the initial response is being awaited or was taken)."""
        self._settled = True
        self._release()

    async def __aenter__(self) -> StartedCell:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"StartedCell(cell_id={self.cell_id!r})"
