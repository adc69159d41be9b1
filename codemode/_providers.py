"""What every provider is: the `Provider` protocol and the record its `statistics()` returns.

Four providers serve sessions: in this process (`codemode.inprocess`), in host processes
(`codemode.process`), in listening hosts (`codemode.remote`) and in Ray's host actors
(`codemode.ray`). Each satisfies `Provider`, and each reports the same `ProviderStatistics`,
whatever serves its cells (design.md, style 11: `statistics()` returns a frozen record).

No trio here: the front door exports these names, and `import codemode` stays sans-IO.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import msgspec

from ._api import CellLimits, Session
from ._limits import ToolThreadStatistics


class HostLoad(msgspec.Struct, frozen=True, kw_only=True):
    """One host of a provider, as `statistics()` reports it.

    Parameters:
        index: its place among the provider's hosts, from 0 (a pool's slot, a remote
            provider's address, a Ray provider's actor).
        pid: its host process's id, for a host this provider started and runs now (a process
            provider's); None otherwise (not spawned yet, lost and not yet replaced, retired,
            or a remote host).
        sessions: sessions placed on it (a process provider's: also while their host is lost
            and not yet replaced; a remote provider's: those open on its live connection, and
            those being opened there).
        cells: cells it holds for them: admitted and not yet reported closed (a cell that
            completed counts until its closing frame, which follows its result).
        address: where it listens (`tcp://HOST:PORT`, `unix:PATH`), for a remote host; None
            for a host process of this provider.
    """

    index: int
    pid: int | None
    sessions: int
    cells: int
    address: str | None = None


class ProviderStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """What a provider holds now, the same record for every provider.

    Parameters:
        hosts: its hosts, by index (empty in-process: the cells run in this process).
        spawned: hosts it started or connected to since it opened, replacements included
            (0 in-process).
        retired: hosts it closed because they were idle (a pool's; 0 elsewhere).
        sessions: its sessions that are not shut down.
        cells: the cells its sessions hold: admitted and not yet closed (for a provider with
            hosts, the sum of theirs).
        tool_threads: its sync tools' threads (`tool_thread_statistics()`).
    """

    hosts: tuple[HostLoad, ...]
    spawned: int
    retired: int
    sessions: int
    cells: int
    tool_threads: ToolThreadStatistics


@runtime_checkable
class Provider(Protocol):
    """What `open_in_process_provider`, `open_process_provider`, `open_remote_provider` and
    `codemode.ray.open_ray_provider` give their block."""

    async def create_session(
        self,
        limits: CellLimits | None = None,
        *,
        store_load: bool = True,
        keep_stored_values: bool = False,
    ) -> Session:
        """A new session with its own cells, stored values and limits (`store_load=False`:
        its cells have no `store` / `load`, and nothing is retained; `keep_stored_values`:
        its committed stored values survive the loss of its host, docs/durability.md)."""
        ...

    def statistics(self) -> ProviderStatistics:
        """What the provider holds now: its hosts, sessions, cells and tool threads."""
        ...

    def tool_thread_statistics(self) -> ToolThreadStatistics:
        """What the threads of the sessions' sync tools hold now (`docs/limits.md`)."""
        ...
