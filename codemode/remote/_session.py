"""A session served by a listening host (implements `codemode.Session`).

Everything but binding is the process session's (`codemode.process._session`): the same
operations, errors, generations and cell ids (`g2:1`). Binding differs in two ways:

1. Placement: the session opens on the least-loaded reachable host of the provider
   (`RemoteProvider._link`); a host that refuses it for admission (`AdmissionError`), or is
   lost while it opens, is skipped and the next one tried. Only the opening is retried:
   established work is never replayed.
2. Replacement (design.md, host 7, the gRPC reconnect): once the session's connection
   is lost, its next operation reopens it on a fresh connection (the next generation) and
   fails with `RuntimeReplacedError`, once; so does every operation that was waiting for that
   reopening. Later operations run on the new connection. If no host can be reached, the
   operation fails with `HostLostError` and the replacement is still owed to the next one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._api import CellLimits
from .._wire import HostLink, ProcessSession
from .._wire._session import _Binding
from ..errors import AdmissionError, HostLostError, RuntimeReplacedError

if TYPE_CHECKING:
    from ._provider import RemoteProvider


class RemoteSession(ProcessSession):
    """A code-mode session whose cells run in a remote host."""

    def __init__(
        self, provider: RemoteProvider, limits: CellLimits, *, store_load: bool = True
    ) -> None:
        super().__init__(provider, limits, store_load=store_load)
        self._remote = provider

    @property
    def is_alive(self) -> bool:
        """False once shutdown began, the provider closed, or while its host is lost (also
        after a failed reopening)."""
        reopening = self._binding is None and self._generation > 0
        return super().is_alive and not reopening

    @property
    def _live_link(self) -> HostLink | None:
        """The connection the session is open on (None before it opened, or once lost)."""
        binding = self._binding
        return binding.link if binding is not None and binding.link.alive else None

    async def _bind(self) -> _Binding:
        self._check()
        binding = self._binding
        if binding is not None and binding.link.alive:
            return binding  # no checkpoint, as in the process session
        generation = self._generation
        async with self._bind_lock:
            self._check()
            binding = self._binding
            if binding is not None and binding.link.alive:
                # Another operation reopened the session while this one waited (rule 2).
                if generation != self._generation:
                    raise RuntimeReplacedError()
                return binding
            if binding is not None:
                self._retired.append(binding)
                self._binding = None
            replaced = self._generation > 0
            binding = await self._place()
            if replaced:
                raise RuntimeReplacedError()
            return binding

    async def _place(self) -> _Binding:
        """Rule 1: open on the least-loaded host that takes the session."""
        failures: list[str] = []
        refusal: AdmissionError | None = None
        for host in self._remote._ranked():
            with self._remote._placing(host):
                try:
                    link = await self._remote._connect(host)
                except HostLostError as error:
                    failures.append(str(error))
                    continue
                try:
                    return await self._open_on(link)
                except AdmissionError as error:
                    refusal = error
                except HostLostError as error:
                    if link.alive:
                        raise
                    failures.append(str(error))
        if refusal is not None:
            raise refusal
        raise HostLostError("no code-mode host could open the session: " + "; ".join(failures))
