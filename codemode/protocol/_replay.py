"""What a resumable connection keeps to survive a cut stream: sequence numbers, sans-IO.

With `RESUME_CAPABILITY`, every frame after the handshake except the connection's own
(`_connection_messages`: ping, pong, ack, resume, goodbye) is *sequenced*: each side numbers
the frames it sends from 1 (implicitly, by counting: no number travels with a frame) and
counts the sequenced frames it received whole. A side keeps each frame it sent until the peer
acknowledges it (`connection/ack`, at least every `ACK_EVERY` frames and with every ping); when
the stream is cut, mid-frame perhaps, both sides drop the partial frame and what was queued
for the dead stream, and on the new stream each tells the other how many frames it received
(`connection/resume`, `connection/resumed`) and replays the rest, in order. So every sequenced
frame reaches the peer's connection exactly once, whatever the cut: no request runs twice, no
answer or tool call is lost, and nothing above the connections sees the cut.

Rules:
1. A frame's copy is kept from the moment it is queued, also while no stream is attached
   (`attached` False: the frame goes only to the book); the adapter's buffers may die with a
   stream, the book does not.
2. An acknowledgement can only move forward and never past what was sent (else the peer broke
   the protocol); one behind is ignored (it crossed a resume).
3. On a resume, the peer's count must lie between what it acknowledged and what was sent:
   anything else means the two sides do not share a history, and the resume is refused.
"""

from __future__ import annotations

import collections

from ._codec import FrameEncoder
from ._connection_messages import Ack
from ._errors import RemoteProtocolError

ACK_EVERY = 64
"""Sequenced frames received before an acknowledgement is due (pings carry one too)."""


class ReplayBook:
    """One side's sequence numbers and its unacknowledged frames."""

    def __init__(self, encoder: FrameEncoder) -> None:
        self._encoder = encoder
        self.sent = 0
        """Sequenced frames queued, ever."""
        self.received = 0
        """Sequenced frames received whole, ever."""
        self.attached = True
        """A stream is attached: queued frames also go to the outgoing buffer (rule 1)."""
        self._frames: collections.deque[bytes] = collections.deque()
        self._bytes = 0
        self._told = 0  # the `received` the peer last heard from us

    @property
    def unacknowledged(self) -> tuple[int, int]:
        """Frames kept for a replay, and their bytes."""
        return len(self._frames), self._bytes

    def queue(self, message: object, out: bytearray) -> None:
        """Number `message`, keep its frame, and append it to `out` when attached."""
        if self.attached:
            start = len(out)
            self._encoder.encode_into(message, out)
            frame = bytes(memoryview(out)[start:])
        else:
            frame = self._encoder.encode(message)
        self._frames.append(frame)
        self._bytes += len(frame)
        self.sent += 1

    def received_one(self) -> bool:
        """A sequenced frame arrived whole; True when an acknowledgement is due."""
        self.received += 1
        return self.received - self._told >= ACK_EVERY

    def ack(self) -> Ack | None:
        """The acknowledgement to send now (None: the peer knows our count already)."""
        if self.received == self._told:
            return None
        self._told = self.received
        return Ack(received=self.received)

    def acknowledged(self, received: int) -> None:
        """The peer received our frames up to `received` (rule 2)."""
        if received > self.sent:
            raise RemoteProtocolError(
                f"code-mode peer acknowledged {received} frames; {self.sent} were sent"
            )
        forget = received - (self.sent - len(self._frames))
        for _ in range(forget):
            self._bytes -= len(self._frames.popleft())

    def can_replay_to(self, received: int) -> bool:
        """Rule 3: the peer's count on a resume matches what this side kept."""
        return self.sent - len(self._frames) <= received <= self.sent

    def detach(self) -> None:
        """The stream was cut: keep numbering and keeping, write nowhere."""
        self.attached = False

    def replay(self, received: int, out: bytearray) -> None:
        """Attach a new stream: append every frame after the peer's `received` to `out`
        (the peer told its count, so ours is known to it too). Check `can_replay_to` first."""
        self.acknowledged(received)
        for frame in self._frames:
            out += frame
        self._told = self.received
        self.attached = True
