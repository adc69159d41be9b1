"""Resuming a host link's cut connection: reconnect, present the token, wait for the answer
(`_link_core.py`, rule 4; docs/protocol.md, "Resuming a cut connection").

The sans-IO connection keeps every frame the host has not acknowledged and counts what it
received (`codemode.protocol._replay`); a `Resumer` only finds a new stream for it. It runs as
one task of the link from the cut until the host took the resume, and is the link's only
path back: a second cut while it tries (the new stream dies too) is just another attempt.

Rules:
1. Every attempt, and the backoff between them (from `FIRST_DELAY`, doubling, at most
   `MAX_DELAY`), ends by the host's grace deadline: past it the host has freed the sessions,
   and the link is lost ("could not resume").
2. A host that took the new stream answers the resume at once; one that does not answer
   within `ANSWER_TIMEOUT` (it accepted the connection but its loop is stopped or wedged) is
   lost, as a silent host is (`_heartbeat.py`).
3. A refused resume (an unknown or spent token) is a loss the link reports itself, with the
   host's reason (`ResumeFailed`); so is nothing listening at the host's address any more
   (`NothingListeningError`: the host is gone, not the path to it).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from ..errors import HostLostError
from ._transport import HostTransport, NothingListeningError

if TYPE_CHECKING:
    from ._link_core import LinkCore

logger = logging.getLogger("codemode.process")

FIRST_DELAY = 0.05
"""Seconds before the second attempt; doubled after each failure (rule 1)."""
MAX_DELAY = 1.0
"""The longest wait between two attempts."""
ANSWER_TIMEOUT = 5.0
"""Seconds the host has to answer a resume on a stream it accepted (rule 2)."""


class Resumer:
    """Finds a new stream for a cut connection, until the host's grace ends."""

    def __init__(self, transport: HostTransport, link: LinkCore, grace: float, reason: str) -> None:
        self._transport = transport
        self._link = link
        self._grace = grace
        self._reason = reason
        self._outcome = trio.Event()
        self._answered = False

    def answered(self) -> None:
        """The host took the resume (`ConnectionResumed`)."""
        self._answered = True
        self._outcome.set()

    def cut(self) -> None:
        """The stream of the current attempt was cut too: try again."""
        self._outcome.set()

    async def run(self) -> None:
        logger.info("code-mode host connection was cut (%s): resuming", self._reason)
        deadline = trio.current_time() + self._grace
        delay = FIRST_DELAY
        attempts = 0
        while self._link.failure is None:
            if trio.current_time() >= deadline:
                self._link.resume_failed(
                    f"code-mode host connection was cut ({self._reason}) and could not be"
                    f" resumed within the host's grace of {self._grace:g} s"
                    f" ({attempts} attempts)"
                )
                return
            attempts += 1
            if await self._attempt(deadline):
                logger.info("code-mode host connection resumed after %d attempts", attempts)
                self._link.resumed()
                return
            with trio.move_on_at(deadline):
                await trio.sleep(delay)
            delay = min(2 * delay, MAX_DELAY)

    async def _attempt(self, deadline: float) -> bool:
        """One reconnect and resume; True once the host took it."""
        try:
            with trio.fail_at(deadline):
                send, receive = await self._transport.reopen()
        except NothingListeningError as refused:
            self._link.resume_failed(
                f"code-mode host connection was cut ({self._reason}): {refused}"
            )
            return False
        except (HostLostError, trio.TooSlowError) as error:
            logger.debug("resuming the code-mode host connection: %s", error)
            return False
        if self._link.failure is not None:
            return False
        self._outcome = trio.Event()
        self._link.resuming()
        self._link.attach(send, receive)
        with trio.move_on_at(min(deadline, trio.current_time() + ANSWER_TIMEOUT)) as timer:
            await self._outcome.wait()
        if timer.cancelled_caught and self._link.failure is None:
            self._link.resume_failed(  # rule 2
                "code-mode host stopped answering: it accepted a new connection but did not"
                f" answer the resume within {ANSWER_TIMEOUT:g} s"
            )
        return self._answered
