"""A value delivered once and awaited by one task: the answer to something sent across the wire.

Shared by the host (answers to its reverse calls) and the client (operation responses and
initial responses).

Rules:
1. A value is either taken by its waiter or refused. `set` returns False when the waiter was
   cancelled before the value arrived (trio delivered the cancellation first, so `get` raises
   `Cancelled` and can never return it); the one who set it then still holds the value and
   must not drop it (the client's connection parks a refused observation for the cell's next
   observer). Once `set` succeeded, `get` returns the value even if its task is cancelled
   meanwhile.
2. A value that is already there is returned without a checkpoint: it cannot be cancelled
   (rule 1), and a schedule point there cost a whole pass of the scheduler. On the client an
   initial response often arrives in the same read as its `ExecutionStarted` and is set while
   the caller takes it: the pass was about 8 % of the client's instructions a `text("hi")`
   cell. Whoever set the value had to get it from the peer, so the caller of `get` waited for
   the peer's bytes already (the reader's wait is the checkpoint that let others run).
"""

from __future__ import annotations

from typing import Final, Generic, TypeVar

import trio

T = TypeVar("T")

# `Final`: the compiled build reads these as C statics; `trio.lowlevel.reschedule` is a lookup
# of `trio` and two attribute reads, for every answer.
_reschedule: Final = trio.lowlevel.reschedule
_current_task: Final = trio.lowlevel.current_task
_wait_task_rescheduled: Final = trio.lowlevel.wait_task_rescheduled


class _Unset:
    pass


_UNSET: Final = _Unset()


class OneShot(Generic[T]):
    """Holds the first value `set` delivers, for the one task that awaits it."""

    __slots__ = ("_task", "_value", "refused")

    def __init__(self) -> None:
        self._value: T | _Unset = _UNSET
        self._task: trio.lowlevel.Task | None = None
        self.refused = False
        """True once the waiter was cancelled before any value arrived."""

    # `set` and `get` test `_value` inline, not through `is_set()`: they run for every answer,
    # and the method calls were about six of the client's 400 calls a cell.

    def is_set(self) -> bool:
        return self._value is not _UNSET

    def set(self, value: T) -> bool:
        """Deliver `value`; False if it was refused (its waiter gone) or one was already set."""
        if self.refused or self._value is not _UNSET:
            return False
        self._value = value
        if self._task is not None:
            _reschedule(self._task)
            self._task = None
        return True

    async def get(self) -> T:
        """Wait for the value and return it.

        Raises:
            trio.Cancelled: cancelled before a value arrived (the slot then refuses one).
        """
        value = self._value
        if not isinstance(value, _Unset):
            return value  # rule 2
        if self.refused or self._task is not None:
            raise RuntimeError("a OneShot is awaited once, by one task")
        self._task = _current_task()

        def abort(_: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
            self._task = None
            self.refused = True
            return trio.lowlevel.Abort.SUCCEEDED

        await _wait_task_rescheduled(abort)
        value = self._value
        assert not isinstance(value, _Unset), "rescheduled only by `set`"
        return value
