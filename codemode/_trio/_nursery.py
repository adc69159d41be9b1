"""A nursery for `open_*` context managers whose body's own exception leaves them as itself.

trio wraps whatever leaves a nursery in an `ExceptionGroup` (strict exception groups). For a
context manager like `open_process_provider` that is wrong: the body is the caller's code, and
its `KeyError` (or our own `SessionShuttingDownError`) must reach the caller's `except` clause
unchanged. The nursery's own tasks are written never to raise, so a group holding exactly the
body's exception (possibly beside `Cancelled`s of the nursery's tasks) is unwrapped; any other
group is a real multi-error and propagates as it is (trio-websocket's `open_websocket` makes the
same choice, design.md, style 8).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio


@asynccontextmanager
async def open_service_nursery() -> AsyncIterator[trio.Nursery]:
    """A nursery whose body's exception propagates unwrapped.

    Raises:
        BaseException: whatever the body raised, as itself; an `ExceptionGroup` only when a
            task of the nursery failed too.
    """
    raised: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            try:
                yield nursery
            except BaseException as error:
                raised = error
                raise
    except BaseExceptionGroup as group:
        if raised is None or not _only(group, raised):
            raise
        _reraise(raised)


def _only(group: BaseExceptionGroup[BaseException], error: BaseException) -> bool:
    """Whether `group` holds `error` and otherwise nothing but `trio.Cancelled`."""
    found = False
    for leaf in _leaves(group):
        if leaf is error:
            found = True
        elif not isinstance(leaf, trio.Cancelled):
            return False
    return found


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    leaves: list[BaseException] = []
    for inner in group.exceptions:
        if isinstance(inner, BaseExceptionGroup):
            leaves.extend(_leaves(inner))
        else:
            leaves.append(inner)
    return leaves


def _reraise(error: BaseException) -> None:
    # Raising inside the `except` block would chain the group as the error's __context__;
    # the caller's traceback should show their own error only, with its own context.
    context = error.__context__
    try:
        raise error
    finally:
        error.__context__ = context
        del error
