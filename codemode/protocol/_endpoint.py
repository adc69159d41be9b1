"""The byte side both connections share: frames queued out, frames decoded in, events out.

`Endpoint` owns the outgoing buffer (`data_to_send`, or `take_outgoing` for an adapter that
writes the buffer itself), the incoming decoder (`receive_data`),
end of file, the event queue (`next_event`) and the connection's state (`_states.CONNECTION`):
any exception while an event is made moves it to ERROR, after which every call raises
`LocalProtocolError` (h11's rule, enforced here rather than by each adapter). A connection
subclass says what a received message means (`_receive`, which appends events), what to make of
a frame that does not decode (`_undecodable`) and queues its own frames (`_queue`).
"""

from __future__ import annotations

import collections
from typing import Generic, TypeVar

from ._capabilities import HEARTBEAT_CAPABILITY
from ._codec import NEED_DATA, FrameDecodeError, FrameDecoder, FrameEncoder, NeedData
from ._connection_messages import Ping, Pong
from ._errors import LocalProtocolError, RemoteProtocolError
from ._events import ConnectionEnded
from ._states import CONNECTION, ConnectionState, ConnectionTrigger

M = TypeVar("M")
"""The messages this side receives."""
E = TypeVar("E")
"""The events this side hands out."""


class Endpoint(Generic[M, E]):
    """Bytes in, events out; frames queued, bytes out. No I/O."""

    def __init__(self, incoming: object) -> None:
        self._encoder = FrameEncoder()
        self._decoder: FrameDecoder[M] = FrameDecoder(incoming)  # type: ignore[arg-type]
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

    def ping(self) -> bool:
        """Queue `connection/ping` when both ends agreed on heartbeats and the connection is
        open; False (nothing queued) otherwise. The peer answers with `connection/pong`; any
        frame from it shows it is alive (the adapter times that)."""
        if self._state is not ConnectionState.OPEN or HEARTBEAT_CAPABILITY not in self.capabilities:
            return False
        self._queue(Ping())
        return True

    def _heartbeat(self, message: Ping | Pong) -> None:
        """A ping is answered at once; a pong needs nothing (its bytes were the answer)."""
        if HEARTBEAT_CAPABILITY not in self.capabilities:
            raise RemoteProtocolError(
                f"{type(message).__name__.lower()} without the `{HEARTBEAT_CAPABILITY}` capability"
            )
        if isinstance(message, Ping):
            self._queue(Pong())

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
                except FrameDecodeError as error:
                    self._undecodable(error)
                    continue
                if message is NEED_DATA:
                    if not self._eof:
                        return NEED_DATA
                    if self._decoder.buffered:
                        raise RemoteProtocolError("EOF inside a code-mode IPC frame")
                    self._move(ConnectionTrigger.ENDED)
                    return ConnectionEnded()
                self._receive(message)
            return self._events.popleft()
        except RemoteProtocolError as error:
            self._fail(str(error), ConnectionTrigger.PROTOCOL_ERROR)
            raise
        except BaseException as error:
            # A bug on this side (or a MemoryError) inside the machine: its state is unknown.
            self._fail(f"{type(error).__name__}: {error}", ConnectionTrigger.PROTOCOL_ERROR)
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
        self._encoder.encode_into(message, self._outgoing)
