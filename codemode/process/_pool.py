"""The process provider's placement strategy: a fixed number of slots for host processes, the
placement of sessions on them, and the retirement of idle hosts (`codemode._wire`'s
`Placement`).

A *slot* holds at most one live host at a time (a `HostLink`); a pool of `hosts=N` has N slots,
each spawned on demand. With one slot this is exactly the shared host of design.md, design 3.
A session re-opened on a replacement host says nothing of it (`_wire/_generations.py`, rule 1).

Rules:
1. Spawning: a slot's host is spawned when a session placed on it needs one, one spawn at a time
   per slot (the slot's lock), in the provider's nursery once the host answered the handshake.
2. Placement: a session that needs a host (its first operation, or its first after its host was
   lost) is placed on the slot with the fewest active cells (cells its host runs: admitted and
   not yet closed), then the fewest sessions, then one whose host is live (spawning costs), then
   the lowest index. Placement is synchronous, so sessions created at once spread at once. A
   session stays on its slot while its host lives; after a loss it is placed again, and it
   counts on its old slot until then, so the lost host's sessions usually return to its slot,
   respawned, and move to a live host only where that one is less loaded.
3. Retirement: a slot whose host is live and that has had no session for `idle_timeout`
   seconds has its host closed (stdin closed, the process reaped), unless it is the pool's last
   live host: one host is kept warm, so with one slot the host lives as long as the provider.
4. Closing: placement and spawning refuse (`ProviderClosedError`), idle timers stop, and every
   host is closed, a spawn in progress first awaited (bounded by the handshake timeout).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable
from typing import TypeVar

import trio

from .._providers import HostLoad
from .._wire import HostLink
from ..errors import ProviderClosedError

_Opened = TypeVar("_Opened")


class _Slot:
    """A place for one host, and the sessions placed on it."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.link: HostLink | None = None
        self.sessions: set[Hashable] = set()
        self.lock = trio.Lock()
        self.idle: trio.CancelScope | None = None

    @property
    def live(self) -> bool:
        return self.link is not None and self.link.alive

    def cells(self) -> int:
        return self.link.statistics().cells if self.link is not None and self.link.alive else 0

    def load(self) -> tuple[int, int, bool, int]:
        """Rule 2's order: the least loaded slot sorts first."""
        return (self.cells(), len(self.sessions), not self.live, self.index)

    def stop_idle_timer(self) -> None:
        if self.idle is not None:
            self.idle.cancel()
            self.idle = None


class HostPool:
    """The slots of one provider. Made by the provider; every task runs in its nursery.

    Args:
        new_link: a link not yet started (its `run` spawns the host).
        size: the number of slots (at least 1).
        idle_timeout: seconds an empty slot keeps its host (rule 3).
        nursery: the provider's nursery.
    """

    def __init__(
        self,
        new_link: Callable[[], HostLink],
        size: int,
        idle_timeout: float,
        nursery: trio.Nursery,
    ) -> None:
        self._new_link = new_link
        self._slots = [_Slot(index) for index in range(size)]
        self._idle_timeout = idle_timeout
        self._nursery = nursery
        self._placed: dict[Hashable, _Slot] = {}
        self._retiring: set[HostLink] = set()
        self._spawned = 0
        self._retired = 0
        self.closed = False

    @property
    def announces_replacement(self) -> bool:
        return False  # design.md, design 3: a session re-opens on a new host silently

    @property
    def spawned(self) -> int:
        return self._spawned

    @property
    def retired(self) -> int:
        """Hosts closed because they were idle (rule 3)."""
        return self._retired

    def hosts(self) -> tuple[HostLoad, ...]:
        """Every slot, by index: its host's pid (None while it has none), its sessions (their
        host may be lost and not yet replaced) and its host's cells."""
        return tuple(
            HostLoad(
                index=slot.index,
                pid=slot.link.pid if slot.live and slot.link is not None else None,
                sessions=len(slot.sessions),
                cells=slot.cells(),
            )
            for slot in self._slots
        )

    async def place(
        self, session: Hashable, open_on: Callable[[HostLink], Awaitable[_Opened]]
    ) -> _Opened:
        """Place `session` (rule 2) and open it on its slot's live host (spawned if needed).
        A failure to open is the operation's: no other slot is tried."""
        return await open_on(await self.link_for(session))

    async def link_for(self, session: Hashable) -> HostLink:
        """Place `session` (rule 2) and return its slot's live host, spawning it if needed.

        Raises:
            HostLostError: the host could not be started (the session stays placed until
                `leave` or its next placement).
            ProviderClosedError: the pool is closing.
        """
        if self.closed:
            raise ProviderClosedError()
        slot = self._place(session)
        async with slot.lock:
            if self.closed:
                raise ProviderClosedError()
            link = slot.link
            if link is not None and link.alive:
                return link
            link = self._new_link()
            await self._nursery.start(link.run)
            slot.link = link
            self._spawned += 1
            return link

    def _place(self, session: Hashable) -> _Slot:
        old = self._placed.pop(session, None)
        if old is not None:
            old.sessions.discard(session)
        slot = min(self._slots, key=_Slot.load)
        slot.sessions.add(session)
        slot.stop_idle_timer()
        self._placed[session] = slot
        if old is not None and old is not slot:
            self._arm_idle_timer(old)
        return slot

    def leave(self, session: Hashable) -> None:
        """`session` is gone (shut down, or never opened): it no longer counts on its slot."""
        slot = self._placed.pop(session, None)
        if slot is not None:
            slot.sessions.discard(session)
            self._arm_idle_timer(slot)

    # ---- retirement (rule 3) -----------------------------------------------------------------

    def _arm_idle_timer(self, slot: _Slot) -> None:
        if len(self._slots) == 1 or slot.sessions or not slot.live or self.closed:
            return
        slot.stop_idle_timer()
        slot.idle = timer = trio.CancelScope()
        self._nursery.start_soon(self._retire_when_idle, slot, timer)

    async def _retire_when_idle(self, slot: _Slot, timer: trio.CancelScope) -> None:
        with timer:
            await trio.sleep(self._idle_timeout)
        if timer.cancelled_caught or slot.idle is not timer:
            return  # a session came (or the pool is closing)
        slot.idle = None
        link = slot.link
        if self.closed or slot.sessions or link is None or not link.alive:
            return
        if not any(other.live for other in self._slots if other is not slot):
            return  # the last live host stays warm
        slot.link = None
        self._retired += 1
        self._retiring.add(link)
        try:
            # A closing host must finish closing even if the provider is cancelled meanwhile
            # (its link's tasks are shielded until `aclose` lifts that); `aclose` is bounded.
            with trio.CancelScope(shield=True):
                await link.aclose()
        finally:
            self._retiring.discard(link)

    # ---- closing (rule 4) --------------------------------------------------------------------

    def abort(self, reason: str) -> None:
        """Give up on every host now: what is pending fails with `reason`."""
        for link in [*(slot.link for slot in self._slots), *self._retiring]:
            if link is not None:
                link.abort(reason)

    async def aclose(self) -> None:
        """Close every host (each bounded, all at once). Idempotent."""
        self.closed = True
        for slot in self._slots:
            slot.stop_idle_timer()
        async with trio.open_nursery() as nursery:
            for slot in self._slots:
                nursery.start_soon(self._close_slot, slot)
            for link in list(self._retiring):
                nursery.start_soon(link.aclose)

    async def _close_slot(self, slot: _Slot) -> None:
        async with slot.lock:  # a spawn in progress finishes (bounded by its handshake)
            link = slot.link
        if link is not None:
            await link.aclose()
