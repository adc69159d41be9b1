"""One operation of the host that `operation/cancel` and `operation/yield` may target.

A wait runs inside a cancel scope that `operation/cancel` cancels (at once if the cancel came
before the wait entered it); an execute's cancel ends its initial observation through the
runtime's hook instead (rule 7 of `runtime/_observer.py`), which costs no cancel scope.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType

import trio
from codemode_host.runtime import Preemption


class Operation:
    """An operation `operation/cancel` may target: a wait's scope (at once if the wait has not
    entered it yet), or an execute's initial observation, through the runtime's hook (rule 7 of
    its `_observer`), which costs no cancel scope."""

    __slots__ = ("_scope", "cancelled", "end_observation", "observed", "preemption")

    def __init__(self) -> None:
        self.cancelled = False
        self._scope: trio.CancelScope | None = None
        self.end_observation: Callable[[], None] | None = None
        """Cancels an execute's initial observation, once its cell was admitted."""
        self.observed: tuple[str, str] | None = None
        """The session and cell an execute observes, once admitted (`operation/yield`)."""
        self.preemption: Preemption | None = None
        """A wait's `operation/yield`, also when it comes before the wait attached."""

    def cancel(self) -> None:
        self.cancelled = True
        if self._scope is not None:
            self._scope.cancel()
        if self.end_observation is not None:
            self.end_observation()

    def scope(self) -> OperationScope:
        """A cancel scope `cancel()` reaches while the block runs (cancelled at once if the
        operation already was)."""
        return OperationScope(self)


class OperationScope:
    """`Operation.scope()`: a class, not a generator context manager, because every wait
    enters one (the generator's machinery showed in profiles)."""

    __slots__ = ("_operation", "_scope")

    def __init__(self, operation: Operation) -> None:
        self._operation = operation
        self._scope = trio.CancelScope()

    def __enter__(self) -> trio.CancelScope:
        scope = self._scope.__enter__()
        if self._operation.cancelled:
            scope.cancel()
        self._operation._scope = scope
        return scope

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        self._operation._scope = None
        return self._scope.__exit__(exc_type, exc, traceback)
