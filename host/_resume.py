"""Where a listening host's cut connections wait for their client's next stream
(docs/protocol.md, "Resuming a cut connection").

A connection that negotiated resume keeps a `ResumeSlot` at the listener's `ResumeDesk` under
its token. A new stream whose first frame is `connection/resume` hands itself over through the
desk (`hand_over`); the connection answers whether it takes it (the counts must match), then
serves on it until it is cut again or ends.

Rules:
1. A token is claimed once: `hand_over` forgets it, so a token presented twice is refused the
   second time; a connection that resumed registers the next token its `resumed` carried.
2. A claimed connection that is still on a stream (the host had not noticed the cut: a
   half-open connection) lets go of that stream first: the client's view of the cut wins.
3. The new stream stays its accepting task's: that task waits (`Handover.done`) while the
   connection uses it, and closes it afterwards.
4. Every wait is bounded: a connection waits for a handover until its grace ends; a handover
   waits for its answer for `ANSWER_TIMEOUT` (a connection that is ending answers no).
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from codemode._trio import OneShot

ANSWER_TIMEOUT = 5.0
"""Seconds a new stream waits for the connection it resumes to take it (rule 4)."""


class Handover:
    """A new stream offered to a cut connection, and the connection's answer."""

    def __init__(
        self, received: int, receive: trio.abc.ReceiveStream, send: trio.abc.SendStream
    ) -> None:
        self.received = received
        """Sequenced frames the client received."""
        self.receive = receive
        self.send = send
        self.answer: OneShot[bool] = OneShot()
        self.done = trio.Event()
        """Set when the connection no longer uses the stream (rule 3)."""


class ResumeSlot:
    """One resumable connection's place at the desk.

    Args:
        cut: lets go of the connection's current stream, if it is on one (rule 2).
    """

    def __init__(self, cut: Callable[[], None]) -> None:
        self._cut = cut
        self._handover: Handover | None = None
        self._arrived = trio.Event()

    def offer(self, handover: Handover) -> None:
        if self._handover is not None:
            self._handover.answer.set(False)  # only the newest stream can be the client's
        self._handover = handover
        self._arrived.set()
        self._cut()

    async def wait(self, deadline: float) -> Handover | None:
        """The next stream offered before `deadline` (None: none came)."""
        with trio.move_on_at(deadline):
            await self._arrived.wait()
        handover, self._handover = self._handover, None
        self._arrived = trio.Event()
        return handover

    def close(self) -> None:
        """The connection ends: a stream offered meanwhile is refused."""
        if self._handover is not None:
            self._handover.answer.set(False)
            self._handover = None


class ResumeDesk:
    """The listener's resumable connections by token.

    Args:
        grace: seconds a cut connection keeps its sessions for a resume (`--resume-grace`).
    """

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self._slots: dict[str, ResumeSlot] = {}

    def __len__(self) -> int:
        return len(self._slots)

    def register(self, token: str, slot: ResumeSlot) -> None:
        self._slots[token] = slot

    def forget(self, token: str | None) -> None:
        if token is not None:
            self._slots.pop(token, None)

    async def hand_over(self, token: str, handover: Handover) -> bool:
        """Offer a new stream to the connection `token` names; True once it took it (then
        wait for `handover.done` before closing the stream), False: refused (rule 1)."""
        slot = self._slots.pop(token, None)
        if slot is None:
            return False
        slot.offer(handover)
        with trio.move_on_after(ANSWER_TIMEOUT):
            return await handover.answer.get()
        return False
