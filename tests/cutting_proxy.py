"""A proxy for the resume tests: it forwards each connection to a listening host (over TCP or
a Unix socket, on either side) and, on command, cuts, stalls or half-opens them
(docs/durability.md).

Everything is driven by the test, never by time: `cut()` resets every connection now (both
sides see it; bytes in flight are lost, mid-frame perhaps), `half_open()` drops only the
client's side (the host sees nothing), `stall()` stops forwarding until `flow()`, and
`refuse(True)` closes new connections at once (the network is down). `cut_after(n)` cuts
once `n` more bytes went from the host to the client, so a cut can land inside a large frame.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from codemode._trio._sockets import HostAddress, connect, open_listener, parse_address

CHUNK = 16 * 1024


class _Pair:
    """One proxied connection: the client's socket and the host's."""

    def __init__(self, client: trio.SocketStream, host: trio.SocketStream) -> None:
        self.client = client
        self.host = host
        self.scope = trio.CancelScope()


class CuttingProxy:
    def __init__(self, target: HostAddress, listen: HostAddress) -> None:
        self._target = target
        self._listen = listen
        self.address = ""
        self._pairs: set[_Pair] = set()
        self._flowing = trio.Event()
        self._flowing.set()
        self._refusing = False
        self._cut_after: int | None = None
        self.accepted = 0
        self.cuts = 0

    @property
    def connections(self) -> int:
        return len(self._pairs)

    def cut(self) -> None:
        """Reset every connection now."""
        self.cuts += 1
        for pair in list(self._pairs):
            pair.scope.cancel()

    def half_open(self) -> None:
        """Close the clients' sides only: the host keeps its sockets and hears nothing."""
        for pair in list(self._pairs):
            pair.client.socket.close()
            self._pairs.discard(pair)

    def stall(self) -> None:
        self._flowing = trio.Event()

    def flow(self) -> None:
        self._flowing.set()

    def refuse(self, refusing: bool) -> None:
        self._refusing = refusing

    def cut_after(self, count: int) -> None:
        """Cut every connection once `count` more bytes went to the client."""
        self._cut_after = count

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listener, bound = await open_listener(self._listen)
        self.address = str(bound)
        async with trio.open_nursery() as nursery:
            task_status.started()
            await trio.serve_listeners(self._handle, [listener], handler_nursery=nursery)

    async def _handle(self, client: trio.SocketStream) -> None:
        if self._refusing:
            await trio.aclose_forcefully(client)
            return
        try:
            host = await connect(self._target)
        except OSError:
            await trio.aclose_forcefully(client)
            return
        assert isinstance(host, trio.SocketStream)
        self.accepted += 1
        pair = _Pair(client, host)
        self._pairs.add(pair)
        try:
            with pair.scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._forward, client, host, pair, False)
                    nursery.start_soon(self._forward, host, client, pair, True)
        finally:
            self._pairs.discard(pair)
            _reset(client)
            _reset(host)
            await trio.aclose_forcefully(client)
            await trio.aclose_forcefully(host)

    async def _forward(
        self,
        source: trio.SocketStream,
        sink: trio.SocketStream,
        pair: _Pair,
        to_client: bool,
    ) -> None:
        try:
            while True:
                data = await source.receive_some(CHUNK)
                await self._flowing.wait()
                if not data:
                    break
                if to_client and self._cut_after is not None:
                    if len(data) >= self._cut_after:
                        data = data[: self._cut_after]
                        self._cut_after = None
                        await sink.send_all(data)
                        self.cut()
                        return
                    self._cut_after -= len(data)
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        pair.scope.cancel()  # one side ended: the connection ends as a cut, both ways


def _reset(stream: trio.SocketStream) -> None:
    """Close with a reset (SO_LINGER 0), as a broken network path looks to both ends (a Unix
    socket has no reset: it just closes)."""
    if stream.socket.family == socket.AF_UNIX:
        return
    try:
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass


@asynccontextmanager
async def cutting_proxy(
    target_address: str, listen: str = "tcp://127.0.0.1:0"
) -> AsyncIterator[CuttingProxy]:
    """A proxy listening at `listen` in front of the host at `target_address`."""
    proxy = CuttingProxy(parse_address(target_address), parse_address(listen))
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.serve)
        yield proxy
        nursery.cancel_scope.cancel()
