"""Closing a provider: its sessions shut down together, bounded, then what served them released.

Every provider (in-process, process, remote; Ray's through the remote one) leaves its block
through `close_provider`, which its `open_*` function calls from its `finally`.

Rules:
1. Every session still open is shut down at once; one whose shutdown fails is logged, and the
   others go on (the provider closes whatever one session says).
2. Past `shutdown_timeout`, `abort()` gives up on what serves the sessions (hosts killed,
   connections aborted: what is pending fails, so the shutdowns end); without `abort`, the
   wait for them ends there (the provider's nursery, cancelled next, ends them).
3. `release()` then runs (the hosts closed), however the shutdowns ended.
4. All of it is shielded from the caller's cancellation and bounded by `bound` seconds.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection

import trio

from ._api import Session


async def close_provider(
    sessions: Collection[Session],
    *,
    shutdown_timeout: float,
    bound: float,
    logger: logging.Logger,
    abort: Callable[[], None] | None = None,
    release: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Shut `sessions` down, then `release()` (rules 1-4)."""
    with trio.CancelScope(shield=True), trio.move_on_after(bound):
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_give_up_after, shutdown_timeout, abort, nursery.cancel_scope)
                async with trio.open_nursery() as shutdowns:
                    for session in list(sessions):
                        shutdowns.start_soon(_shut_down_quietly, session, logger)
                nursery.cancel_scope.cancel()
        finally:
            if release is not None:
                await release()


async def _give_up_after(
    seconds: float, abort: Callable[[], None] | None, waiting: trio.CancelScope
) -> None:
    """Rule 2."""
    await trio.sleep(seconds)
    if abort is None:
        waiting.cancel()
    else:
        abort()


async def _shut_down_quietly(session: Session, logger: logging.Logger) -> None:
    try:
        await session.shutdown()
    except Exception:  # rule 1: the session knows
        logger.exception("shutting a code-mode session down failed")
