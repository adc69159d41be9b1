"""A peer's liveness, for both ends of the wire (docs/protocol.md, "Heartbeats").

A TCP keepalive probe is answered by the peer's kernel even when the peer's process is stopped
or its loop is wedged, and a pipe or a Unix socket has no probes at all: only an answer from
the peer's own code shows it is alive. So, on a connection where both ends agreed on the
`heartbeat` capability, each end runs a `Heartbeat`: the reader calls `heard()` whenever bytes
arrive (any bytes: a 64 MiB frame in transit is alive), and every `interval` seconds without a
word the heartbeat sends `connection/ping`, which the peer answers at once. After `misses`
silent intervals in a row the peer is declared lost.

Silence is counted in intervals this task observed, not in wall time: if this side's own trio
thread stalls (a blocking call, a debugger), the stall counts as one silent interval at most,
because the reader runs right after it and hears what was waiting in the socket.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

HEARTBEAT_INTERVAL = 2.0
"""Seconds of silence before a ping."""
HEARTBEAT_MISSES = 4
"""Silent intervals in a row that make the peer lost: 8 s by default, well past a short stop
(a debugger's, a SIGSTOP of a fraction of a second) or a busy peer's longest pause."""


class Heartbeat:
    """Pings a silent peer and declares it lost after `misses` silent intervals."""

    def __init__(self, interval: float | None = None, misses: int | None = None) -> None:
        # The module's figures are read here, not bound as defaults: tests shorten them.
        self.interval = HEARTBEAT_INTERVAL if interval is None else interval
        self.misses = HEARTBEAT_MISSES if misses is None else misses
        self._heard = True

    def heard(self) -> None:
        """Bytes arrived from the peer."""
        self._heard = True

    async def run(self, ping: Callable[[], bool], lost: Callable[[str], None]) -> None:
        """Until the peer is lost (then `lost(reason)`), or `ping()` says the connection can
        no longer carry one (it closed)."""
        silent = 0
        while True:
            await trio.sleep(self.interval)
            if self._heard:
                self._heard = False
                silent = 0
                continue
            silent += 1
            if silent >= self.misses:
                lost(
                    f"nothing received for {silent} heartbeat intervals of"
                    f" {self.interval:g} s: the peer stopped answering"
                )
                return
            if not ping():
                return
