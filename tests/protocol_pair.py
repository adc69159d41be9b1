"""A client and a host connection wired together in memory (h11 `tests/helpers.py`).

`Pair.flush()` moves the bytes each side queued to the other, cut into chunks of a chosen size,
and collects the events each side produced. Every frame that crosses is also decoded and kept
(`client_frames`, `host_frames`), so tests can assert on the exact frame sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from codemode import AdmissionLimits
from codemode.protocol import (
    LIMITS_CAPABILITY,
    NEED_DATA,
    ClientConnection,
    ClientEvent,
    ClientMessage,
    FrameDecoder,
    HostConnection,
    HostEvent,
    HostMessage,
)


def _chunks(data: bytes, size: int | None) -> Iterator[bytes]:
    if not data:
        return
    if not size:
        yield data
        return
    for start in range(0, len(data), size):
        yield data[start : start + size]


class Pair:
    """An in-memory connection pair; nothing runs until `flush()`."""

    def __init__(
        self,
        *,
        chunk: int | None = None,
        capabilities: Iterable[str] = (LIMITS_CAPABILITY,),
        admission: AdmissionLimits | None = None,
    ) -> None:
        self.client = ClientConnection(optional_capabilities=capabilities)
        self.host = HostConnection(admission=admission)
        self.chunk = chunk
        self.client_frames: list[ClientMessage] = []
        self.host_frames: list[HostMessage] = []
        self.client_events: list[ClientEvent] = []
        self.host_events: list[HostEvent] = []
        self._to_host: FrameDecoder[ClientMessage] = FrameDecoder(ClientMessage)  # type: ignore[arg-type]
        self._to_client: FrameDecoder[HostMessage] = FrameDecoder(HostMessage)  # type: ignore[arg-type]

    def to_host(self) -> list[HostEvent]:
        """Deliver what the client queued; the host's new events."""
        data = self.client.data_to_send()
        self._to_host.receive_data(data)
        while (frame := self._to_host.next_message()) is not NEED_DATA:
            self.client_frames.append(frame)
        events: list[HostEvent] = []
        for piece in list(_chunks(data, self.chunk)) or [b""]:
            if piece:
                self.host.receive_data(piece)
            while (event := self.host.next_event()) is not NEED_DATA:
                events.append(event)
        self.host_events += events
        return events

    def to_client(self, on_event: Callable[[ClientEvent], None] | None = None) -> list[ClientEvent]:
        """Deliver what the host queued; the client's new events (also those it made
        locally since the last call). `on_event` sees each event before the next frame is
        read, as the trio adapter dispatches them."""
        data = self.host.data_to_send()
        self._to_client.receive_data(data)
        while (frame := self._to_client.next_message()) is not NEED_DATA:
            self.host_frames.append(frame)
        events: list[ClientEvent] = []
        for piece in list(_chunks(data, self.chunk)) or [b""]:
            if piece:
                self.client.receive_data(piece)
            while (event := self.client.next_event()) is not NEED_DATA:
                events.append(event)
                if on_event is not None:
                    on_event(event)
        self.client_events += events
        return events

    def client_events_now(self) -> list[ClientEvent]:
        """The client's events that need no new bytes (local answers), as the trio adapter
        takes them right after each call."""
        events: list[ClientEvent] = []
        while (event := self.client.next_event()) is not NEED_DATA:
            events.append(event)
        self.client_events += events
        return events

    def flush(self) -> tuple[list[HostEvent], list[ClientEvent]]:
        """Both directions, host first."""
        return self.to_host(), self.to_client()

    def handshake(self) -> None:
        self.flush()
