"""A wire session's generations: the host binding it is on, and opening the next one after its
host was lost, with the stored values it keeps for it.

`WireSession` asks for its binding on every operation; while the binding's link is alive it
uses it without coming here. Once it is lost, the next operation comes to `next`, which (under
one lock, so concurrent operations open one generation) asks the provider's placement strategy
for a host and opens the session there, saying `RuntimeReplacedError` when the strategy
announces replacements or the session keeps its stored values, unless an operation in flight
said it already (a cut connection that could not be resumed).

Rules:
1. Re-opening after a loss is silent (design.md, design 3), unless the strategy announces
   replacements (listening hosts; design.md, host 7, the gRPC reconnect): then the operation
   that re-opens the session raises `RuntimeReplacedError`, once, and so does every operation
   that was waiting for that re-opening; later operations run on the new connection. If no
   host takes the session, the operation fails (`HostLostError`, `AdmissionError`) and the
   replacement is still owed to the next one. When a cut connection could not be resumed, the
   operations in flight raise it already (`_slots.py`, rule 2): the re-opening is then silent.
   Only the opening is retried (by the strategy), never established work.
2. A session created with `keep_stored_values=True` keeps a copy of what its cells committed
   (the host sends each commit, `session/committed`); its next generation opens with that
   copy, and its re-opening is always announced, with `RUNTIME_REPLACED_KEPT` (running cells
   were lost, stored values were kept), whatever the strategy.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

import trio

from .._api import CellLimits
from ..errors import (
    RUNTIME_REPLACED_KEPT,
    HostLostError,
    InvalidRequestError,
    RuntimeReplacedError,
)
from ..observability._cells import SessionTraces
from ..protocol import (
    BUDGET_CAPABILITY,
    KEPT_VALUES_CAPABILITY,
    LIMITS_CAPABILITY,
    WALL_TIME_CAPABILITY,
    SessionReady,
)
from ._binding import Binding, unwrap
from ._link import HostLink

if TYPE_CHECKING:
    from ._session import WireSession

_Opened = TypeVar("_Opened")


class SessionOwner(Protocol):
    """What a session needs of its provider (`_sessions.WireSessions`)."""

    @property
    def closed(self) -> bool:
        """The provider is closed (rule 3)."""
        ...

    @property
    def nursery(self) -> trio.Nursery:
        """Where the session's shutdown runs (rule 2)."""
        ...

    @property
    def announces_replacement(self) -> bool:
        """Rule 1."""
        ...

    def next_session_id(self) -> str:
        """A session id never used by this provider on any host."""
        ...

    async def place(
        self, session: WireSession, open_on: Callable[[HostLink], Awaitable[_Opened]]
    ) -> _Opened:
        """Find `session` a host and open it there with `open_on` (the placement strategy)."""
        ...

    def forget(self, session: WireSession) -> None:
        """`session` is shut down (or never opened): the provider lets go of it."""
        ...


class Generations:
    """The bindings of one wire session, from its first host to its last."""

    def __init__(
        self,
        provider: SessionOwner,
        limits: CellLimits,
        *,
        store_load: bool,
        keep_stored_values: bool,
        traces: SessionTraces,
    ) -> None:
        self._provider = provider
        self._limits = limits
        self._store_load = store_load
        self._traces = traces
        self._kept: dict[str, bytes] | None = {} if keep_stored_values else None
        """The committed stored values, kept for the next generation (rule 2)."""
        self.binding: Binding | None = None
        self.generation = 0
        self._retired: list[Binding] = []
        self._told = 0
        """The generation whose replacement an operation in flight already announced."""
        self._lock = trio.Lock()

    @property
    def alive(self) -> bool:
        """The current generation's host is alive (or the first is still to be opened)."""
        binding = self.binding
        if binding is None:
            return self.generation == 0
        return binding.link.alive

    async def next(self, session: WireSession, check: Callable[[], None]) -> Binding:
        """The binding of the session's next generation, once the current one is lost (or
        there is none yet): opened by the placement strategy, under the lock, unless another
        operation did it meanwhile (rule 1; `check` runs again under it)."""
        generation = self.generation
        async with self._lock:
            check()
            binding = self.binding
            # Rule 2: a session that keeps its stored values always says it was replaced.
            announce = self._provider.announces_replacement or self._kept is not None
            if binding is not None and binding.link.alive:
                # Another operation re-opened the session while this one waited (rule 1).
                if announce and generation not in (self.generation, self._told):
                    raise self._replaced()
                return binding
            if binding is not None:
                self._retired.append(binding)
                self.binding = None
                if binding.link.announced_replacement(binding.session_id):
                    self._told = self.generation  # an operation in flight said it already
            replaced = self.generation > 0 and self._told != self.generation
            binding = await self._provider.place(session, self._open_on)
            if announce and replaced:
                raise self._replaced()
            return binding

    async def all_bindings(self) -> list[Binding]:
        """Every binding the session had, the retired ones first (for its shutdown)."""
        async with self._lock:
            return [*self._retired, *([self.binding] if self.binding else [])]

    def _replaced(self) -> RuntimeReplacedError:
        if self._kept is not None:
            return RuntimeReplacedError(RUNTIME_REPLACED_KEPT)
        return RuntimeReplacedError()

    def _committed(self, values: dict[str, bytes]) -> None:
        """What a cell committed, merged into the kept copy (rule 2)."""
        if self._kept is not None:
            self._kept.update(values)

    async def _open_on(self, link: HostLink) -> Binding:
        """Open the session on `link` as its next generation (the bind lock is held; the
        placement strategy calls it, on each host it tries)."""
        limits = None
        if self._limits != CellLimits():
            for needed, what, present in (
                (LIMITS_CAPABILITY, "session resource limits", True),
                (WALL_TIME_CAPABILITY, "cell wall time limits", self._limits.max_wall_time_ms),
                (BUDGET_CAPABILITY, "session budgets", self._limits.has_session_budget),
            ):
                if present and needed not in link.capabilities:
                    raise InvalidRequestError(
                        f"code-mode host does not support {what}: missing `{needed}` capability"
                    )
            limits = self._limits
        keeping = self._kept is not None
        if keeping and KEPT_VALUES_CAPABILITY not in link.capabilities:
            raise InvalidRequestError(
                "code-mode host does not support kept stored values: missing"
                f" `{KEPT_VALUES_CAPABILITY}` capability"
            )
        session_id = self._provider.next_session_id()
        ready = unwrap(
            await link.open_session(
                session_id,
                limits,
                store_load=self._store_load,
                stored_values=dict(self._kept) if self._kept else None,
                on_commit=self._committed if keeping else None,
            )
        )
        if not isinstance(ready, SessionReady):
            raise HostLostError("code-mode host returned an invalid open-session response")
        self.generation += 1
        self.binding = Binding(link, session_id, self.generation)
        if self.generation > 1:
            self._traces.host_replaced()
        return self.binding
