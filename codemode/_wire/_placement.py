"""The placement strategy: where a provider's wire sessions find their hosts.

The only part of a wire provider that differs from one provider to the next: the process
provider's pool of host processes (one host by default, `codemode/process/_pool.py`), the remote
provider's listening hosts (`codemode/remote/_hosts.py`; Ray's host actors are listening hosts
whose addresses move). The sessions (`_session.py`) and the provider's book of them
(`_sessions.py`) are the same for all.

Rules for a strategy:
1. `place` chooses a host for the session, reaches it (spawning or connecting, once at a time
   per host), and opens the session there with `open_on`; it decides which failures make it try
   another host. It counts the session on that host until `leave`, or its next `place`.
2. Its figures (`hosts`, `spawned`, `retired`) are synchronous and cheap: `statistics()` reads
   them at any time.
3. Once `closed` is set, `place` raises `ProviderClosedError`; `abort` fails everything pending
   on every host at once; `aclose` closes every host (bounded, idempotent).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable
from typing import Protocol, TypeVar

from .._providers import HostLoad
from ._link import HostLink

Opened = TypeVar("Opened")


class Placement(Protocol):
    """Where a wire provider's sessions run (rules 1-3)."""

    closed: bool
    """Rule 3: set when the provider closes."""

    @property
    def announces_replacement(self) -> bool:
        """True: a session re-opened after its host was lost raises `RuntimeReplacedError`
        once (`_generations.py`, rule 1); False: it re-opens silently."""
        ...

    @property
    def spawned(self) -> int:
        """Hosts started or connected to so far (replacements included)."""
        ...

    @property
    def retired(self) -> int:
        """Hosts closed because they were idle."""
        ...

    async def place(
        self, session: Hashable, open_on: Callable[[HostLink], Awaitable[Opened]]
    ) -> Opened:
        """Rule 1.

        Raises:
            HostLostError: no host could be reached or started (the text says why).
            ProviderClosedError: the strategy is closed.
            Exception: what `open_on` raised on the last host tried.
        """
        ...

    def leave(self, session: Hashable) -> None:
        """`session` is gone (shut down, or never opened): it no longer counts anywhere."""
        ...

    def hosts(self) -> tuple[HostLoad, ...]:
        """Each host's figures, by index (rule 2)."""
        ...

    def abort(self, reason: str) -> None:
        """Give up on every host now: what is pending fails with `reason`."""
        ...

    async def aclose(self) -> None:
        """Close every host (each bounded, all at once). Idempotent."""
        ...
