"""The byte side both connections share: frames queued out, frames decoded in, events out.

`Endpoint` owns the outgoing buffer (`data_to_send`, or `take_outgoing` for an adapter that
writes the buffer itself), the incoming decoder (`receive_data`),
end of file, the event queue (`next_event`) and the connection's state (`_states.CONNECTION`):
any exception while an event is made moves it to ERROR, after which every call raises
`LocalProtocolError` (h11's rule, enforced here rather than by each adapter). A connection
subclass says what a received message means (`_receive`, which appends events), what to make of
a frame that does not decode (`_undecodable`) and queues its own frames (`_queue`).

With `RESUME_CAPABILITY` the endpoint also keeps its `ReplayBook` (`_replay.py`): it numbers
and keeps the frames it queues, counts the ones it receives and acknowledges them, and on a cut
(`suspend`) drops the partial frame and what was queued for the dead stream. The frames about
the stream itself (`_queue_control`: ping, pong, ack, goodbye) are neither numbered nor kept.
"""

from __future__ import annotations

import collections
from typing import Generic, TypeVar

from ._capabilities import HEARTBEAT_CAPABILITY, RESUME_CAPABILITY
from ._codec import NEED_DATA, FrameDecodeError, FrameDecoder, FrameEncoder, NeedData
from ._connection_messages import (
    Ack,
    Goodbye,
    Hello,
    Ping,
    Pong,
    Ready,
    Rejected,
    Resume,
    Resumed,
)
from ._errors import LocalProtocolError, RemoteProtocolError
from ._events import ConnectionEnded, GoodbyeReceived
from ._replay import ReplayBook
from ._states import CONNECTION, ConnectionState, ConnectionTrigger

_UNSEQUENCED: frozenset[type] = frozenset(
    {Ack, Goodbye, Hello, Ping, Pong, Ready, Rejected, Resume, Resumed}
)
"""The frames about the stream itself: never numbered for a replay (`_replay.py`)."""

M = TypeVar("M")
"""The messages this side receives."""
E = TypeVar("E")
"""The events this side hands out."""


class Endpoint(Generic[M, E]):
    """Bytes in, events out; frames queued, bytes out. No I/O."""

    def __init__(self, incoming: object) -> None:
        self._encoder = FrameEncoder()
        self._incoming = incoming
        self._decoder: FrameDecoder[M] = FrameDecoder(incoming)  # type: ignore[arg-type]
        self._replay: ReplayBook | None = None
        """With `RESUME_CAPABILITY`, from the handshake on (`_start_replay`)."""
        self._outgoing = bytearray()
        self._events: collections.deque[E | ConnectionEnded] = collections.deque()
        self._state = ConnectionState.HANDSHAKING
        self.capabilities: frozenset[str] = frozenset()
        """What the handshake selected (empty until it completed)."""
        # Derived from `_state` by `_move`, read on every event and operation: an attribute
        # load where a property or an enum comparison cost a call per cell (instructions.py).
        self._open = True
        self._handshaking = True
        self._closed = False
        self._failed = False
        self._failure: str | None = None
        self._eof = False

    @property
    def state(self) -> ConnectionState:
        """Where the connection stands: handshaking, open, closed or error."""
        return self._state

    @property
    def is_open(self) -> bool:
        """True from construction until the connection ended, failed or was refused."""
        return self._open

    @property
    def resumable(self) -> bool:
        """Both ends agreed on `RESUME_CAPABILITY`: a cut stream can be resumed."""
        return self._replay is not None

    @property
    def unacknowledged(self) -> tuple[int, int]:
        """Frames kept for a replay and their bytes ((0, 0) without resume)."""
        return (0, 0) if self._replay is None else self._replay.unacknowledged

    def ping(self) -> bool:
        """Queue `connection/ping` when both ends agreed on heartbeats and the connection is
        open; False (nothing queued) otherwise. The peer answers with `connection/pong`; any
        frame from it shows it is alive (the adapter times that). With resume, an
        acknowledgement of what arrived since the last one goes first."""
        if self._state is not ConnectionState.OPEN or HEARTBEAT_CAPABILITY not in self.capabilities:
            return False
        if self._replay is not None and (ack := self._replay.ack()) is not None:
            self._queue_control(ack)
        self._queue_control(Ping())
        return True

    def suspend(self) -> None:
        """The stream was cut and the connection is to be resumed on another: drop the
        partial frame received and whatever was queued for the dead stream (the replay book
        keeps every sequenced frame). Operations stay allowed meanwhile.

        Raises:
            LocalProtocolError: resume was not negotiated, or the connection is not open.
        """
        if self._replay is None or self._state is not ConnectionState.OPEN:
            raise LocalProtocolError("code-mode connection cannot be resumed")
        self._decoder = FrameDecoder(self._incoming)  # type: ignore[arg-type]
        self._outgoing = bytearray()
        self._replay.detach()

    def _heartbeat(self, message: Ping | Pong) -> None:
        """A ping is answered at once; a pong needs nothing (its bytes were the answer)."""
        if HEARTBEAT_CAPABILITY not in self.capabilities:
            raise RemoteProtocolError(
                f"{type(message).__name__.lower()} without the `{HEARTBEAT_CAPABILITY}` capability"
            )
        if isinstance(message, Ping):
            self._queue_control(Pong())

    def goodbye(self) -> None:
        """This side ends the connection on purpose: queue `connection/goodbye` (with resume
        only, while a stream is attached)."""
        if self._replay is not None and self._state is ConnectionState.OPEN:
            self._queue_control(Goodbye())

    def _said_goodbye(self) -> None:
        if self._replay is None:
            raise RemoteProtocolError(
                f"connection/goodbye without the `{RESUME_CAPABILITY}` capability"
            )
        self._events.append(GoodbyeReceived())  # type: ignore[arg-type]

    def _acknowledged(self, message: Ack) -> None:
        if self._replay is None:
            raise RemoteProtocolError(
                f"connection/ack without the `{RESUME_CAPABILITY}` capability"
            )
        self._replay.acknowledged(message.received)

    def _start_replay(self) -> None:
        """The handshake selected resume: number every frame from now on."""
        self._replay = ReplayBook(self._encoder)

    def send_failed(self) -> None:
        """The adapter could not write what this connection queued: it is broken (ERROR)."""
        self._fail("sending failed", ConnectionTrigger.SEND_FAILED)

    def data_to_send(self) -> bytes:
        """Every frame queued since the last call, in order (b"" when there is none)."""
        return bytes(self.take_outgoing())

    def take_outgoing(self) -> bytearray:
        """As `data_to_send`, but the buffer itself, which the caller now owns: no copy of
        what may be a frame of many megabytes (the trio adapters' `FrameWriter` writes it)."""
        data, self._outgoing = self._outgoing, bytearray()
        return data

    def receive_data(self, data: bytes | bytearray) -> None:
        """Feed bytes read from the peer; b"" means end of file.

        Raises:
            LocalProtocolError: the connection failed earlier.
        """
        if self._failed:
            self._check_not_failed()
        if data:
            self._decoder.receive_data(data)
        else:
            self._eof = True

    def next_event(self) -> E | ConnectionEnded | NeedData:
        """The next event, or NEED_DATA when more bytes must be read first. One frame is
        decoded at a time, so an adapter acts on each event before the next frame is read.

        Raises:
            RemoteProtocolError: the peer broke the protocol (framing, ids, ordering); the
                connection is in ERROR from now on.
            LocalProtocolError: the connection failed earlier.
        """
        if self._failed:
            self._check_not_failed()
        try:  # one frame at a time, inline: this runs for every event of every cell
            while not self._events:
                if self._closed:
                    return NEED_DATA
                try:
                    message = self._decoder.next_message()
                except FrameDecodeError as undecodable:
                    self._undecodable(undecodable)
                    continue
                if message is NEED_DATA:
                    if not self._eof:
                        return NEED_DATA
                    if self._decoder.buffered:
                        raise RemoteProtocolError("EOF inside a code-mode IPC frame")
                    self._move(ConnectionTrigger.ENDED)
                    return ConnectionEnded()
                replay = self._replay
                if (
                    replay is not None
                    and type(message) not in _UNSEQUENCED
                    and replay.received_one()
                    and (ack := replay.ack()) is not None
                ):
                    self._queue_control(ack)
                self._receive(message)
            return self._events.popleft()
        except RemoteProtocolError as error:
            self._fail(str(error), ConnectionTrigger.PROTOCOL_ERROR)
            raise
        except BaseException as bug:
            # A bug on this side (or a MemoryError) inside the machine: its state is unknown.
            self._fail(f"{type(bug).__name__}: {bug}", ConnectionTrigger.PROTOCOL_ERROR)
            raise

    def _undecodable(self, error: FrameDecodeError) -> None:
        """A whole frame whose payload is not a valid message: fatal unless a subclass can
        answer it (the host, after the handshake)."""
        raise error

    def _move(self, trigger: ConnectionTrigger) -> None:
        state = self._state = CONNECTION.move(self._state, trigger)
        self._handshaking = state is ConnectionState.HANDSHAKING
        self._open = self._handshaking or state is ConnectionState.OPEN
        self._failed = state is ConnectionState.ERROR
        self._closed = not self._open

    def _fail(self, reason: str, trigger: ConnectionTrigger) -> None:
        if self._failure is None:
            self._failure = reason
        self._move(trigger)

    def _check_not_failed(self) -> None:
        if self._failed:
            raise LocalProtocolError(
                f"the code-mode connection is unusable after an error: {self._failure}"
            )

    def _receive(self, message: M) -> None:
        raise NotImplementedError

    def _queue(self, message: object) -> None:
        """Queue a frame of the protocol (numbered and kept, with resume)."""
        if self._replay is None:
            self._encoder.encode_into(message, self._outgoing)
        else:
            self._replay.queue(message, self._outgoing)

    def _queue_control(self, message: object) -> None:
        """Queue a frame about the stream itself: never numbered, dropped while no stream is
        attached (the next stream has its own)."""
        if self._replay is None or self._replay.attached:
            self._encoder.encode_into(message, self._outgoing)
