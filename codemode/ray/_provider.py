"""`open_ray_provider`: code-mode hosts as Ray actors, sessions through the remote provider.

Ray places the hosts and restarts them; codemode connects to them (`codemode.remote`).

Rules:
1. Ray is the caller's: `ray.init()` (a local instance, or `address=` of a cluster) comes
   before `open_ray_provider`, `ray.shutdown()` after it. The provider starts and kills only
   its own actors.
2. Start: `hosts` actors (`_actor.HostActor`), each with `num_cpus=1`, `max_restarts`,
   `max_task_retries=-1` (a call on a restarting actor waits for it) and the
   `scheduling_strategy` (`"SPREAD"` by default: over as many nodes as have a free CPU). The
   block opens once every actor reported its host's address, within `start_timeout`;
   otherwise every actor is killed and `HostLostError` raised.
3. A lost connection to a host makes the remote provider ask its actor for the address again
   (the `resolve` hook, bounded by `connect_timeout`): an actor Ray restarted reports its new
   host (a new port, maybe a new node). An actor out of restarts, or one that does not answer
   in time, leaves its host unreachable (`HostLostError`): sessions go to the others.
4. Exit: the remote provider closes (sessions shut down, connections closed); then each actor
   stops its host (reaped) and is killed without restart. Shielded, bounded by `STOP_TIMEOUT`.
   An exception raised in the block leaves it as itself.
5. Ray's calls block (or wait on Ray's own threads and event loop): each goes through
   `trio.to_thread.run_sync`, abandoned on cancel and bounded by a timeout of its own, so the
   trio thread never blocks on Ray. This is `codemode.ray`'s exception to the trio-only rule
   (docs/architecture.md).
"""

from __future__ import annotations

import logging
import ssl
import time
import warnings
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import ray
import trio

from .._api import CellLimits, Session, ToolThreadStatistics
from .._providers import ProviderStatistics
from .._wire import CONNECT_TIMEOUT, HANDSHAKE_TIMEOUT, SHUTDOWN_TIMEOUT
from ..errors import HostLostError
from ..remote import RemoteProvider, open_remote_provider
from ._actor import STOP_GRACE, HostActor

logger = logging.getLogger("codemode.ray")

START_TIMEOUT = 60.0
"""Seconds the actors have to start their hosts (rule 2): a new worker process each, on a
node that may have to start it."""
STOP_TIMEOUT = STOP_GRACE + 5.0
"""Seconds the exit gives the actors to stop their hosts and be killed (rule 4)."""


class RayProvider:
    """Creates sessions served by hosts that Ray placed. Made by `open_ray_provider()`."""

    def __init__(self, remote: RemoteProvider, actors: Sequence[Any]) -> None:
        self._remote = remote
        self._actors = tuple(actors)

    @property
    def actors(self) -> tuple[Any, ...]:
        """The host actors' handles (`ray.actor.ActorHandle`), one per host, in order."""
        return self._actors

    @property
    def addresses(self) -> list[str]:
        """The hosts' current addresses, in the actors' order."""
        return self._remote.addresses

    def placement(self) -> dict[str, int]:
        """The live sessions of this provider on each host, by current address."""
        return self._remote.placement()

    def statistics(self) -> ProviderStatistics:
        """The hosts (for each: its current address, its sessions and its cells, in the
        actors' order), the sessions, cells and tool threads (`RemoteProvider`)."""
        return self._remote.statistics()

    def tool_thread_statistics(self) -> ToolThreadStatistics:
        """What the threads of the sessions' sync tools hold now (`docs/limits.md`)."""
        return self._remote.tool_thread_statistics()

    async def create_session(
        self,
        limits: CellLimits | None = None,
        *,
        store_load: bool = True,
        keep_stored_values: bool = False,
    ) -> Session:
        """A new session on the least-loaded host that takes it (`RemoteProvider`)."""
        return await self._remote.create_session(
            limits, store_load=store_load, keep_stored_values=keep_stored_values
        )


@asynccontextmanager
async def open_ray_provider(
    hosts: int | None = None,
    *,
    num_hosts: int | None = None,
    token: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
    listen_host: str | None = None,
    host_options: Sequence[str] = (),
    scheduling_strategy: Any = "SPREAD",
    max_restarts: int = -1,
    start_timeout: float = START_TIMEOUT,
    handshake_timeout: float = HANDSHAKE_TIMEOUT,
    connect_timeout: float = CONNECT_TIMEOUT,
    shutdown_timeout: float = SHUTDOWN_TIMEOUT,
) -> AsyncIterator[RayProvider]:
    """A provider whose sessions run in `hosts` host actors on the Ray cluster, for the block.

    Args:
        hosts: how many host actors to start (one CPU each), as `open_process_provider`'s
            `hosts` counts its host processes.
        num_hosts: the former name of `hosts` (deprecated: `DeprecationWarning`).
        token: the hosts' shared secret, given to each host in its environment; required
            unless the hosts listen on loopback.
        ssl_context: the client's TLS (hosts started with `--tls-cert`/`--tls-key` in
            `host_options`).
        listen_host: the IP each host listens on (None: its node's IP as Ray knows it;
            `"0.0.0.0"`: every interface, reported with the node's IP).
        host_options: more `codemode-host` options, e.g. `["--tls-cert", PATH, "--tls-key",
            PATH]` with paths on every node.
        scheduling_strategy: Ray's, for the actors (`"SPREAD"`, `"DEFAULT"`, a placement
            group strategy).
        max_restarts: how often Ray restarts each actor (-1: without end).
        start_timeout: seconds every actor has to report its host's address.
        handshake_timeout, connect_timeout, shutdown_timeout: the remote provider's
            (`open_remote_provider`); `connect_timeout` also bounds asking an actor for its
            address after a lost connection (rule 3).

    Resource handling: Ray must be initialised (`ray.init()`) by the caller. The actors live
    for the block; leaving it shuts every session down, stops every host and kills every
    actor, shielded and bounded (rule 4).

    Error handling: an exception raised in the block leaves it as itself. Actors that cannot
    start their hosts raise `HostLostError` on entry (the host's last words in the text);
    `hosts` below 1 raises `ValueError`; both `hosts` and `num_hosts`, or neither, raise
    `TypeError`; Ray not initialised raises `RuntimeError`.
    """
    hosts = _host_count(hosts, num_hosts)
    if hosts < 1:
        raise ValueError("open_ray_provider needs at least one host")
    if not ray.is_initialized():
        raise RuntimeError("open_ray_provider needs Ray: call ray.init() first")
    options = {
        "num_cpus": 1,
        "max_restarts": max_restarts,
        "max_task_retries": -1,
        "scheduling_strategy": scheduling_strategy,
    }
    arguments = {
        "listen_host": listen_host,
        "token": token,
        "host_options": list(host_options),
    }
    actors: list[Any] = await trio.to_thread.run_sync(_create, hosts, options, arguments)
    try:
        addresses = await trio.to_thread.run_sync(
            _addresses, actors, start_timeout, abandon_on_cancel=True
        )
        async with open_remote_provider(
            addresses,
            token=token,
            ssl_context=ssl_context,
            handshake_timeout=handshake_timeout,
            connect_timeout=connect_timeout,
            shutdown_timeout=shutdown_timeout,
            resolve=partial(_resolve, actors, connect_timeout),
        ) as remote:
            yield RayProvider(remote, actors)
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(STOP_TIMEOUT + 1.0):
            await trio.to_thread.run_sync(_stop, actors, abandon_on_cancel=True)


def _host_count(hosts: int | None, num_hosts: int | None) -> int:
    """`hosts`, or the deprecated `num_hosts` (warned about); exactly one of them."""
    if num_hosts is not None:
        if hosts is not None:
            raise TypeError("open_ray_provider takes hosts or num_hosts, not both")
        warnings.warn(
            "open_ray_provider(num_hosts=...) is deprecated: use hosts=...",
            DeprecationWarning,
            stacklevel=4,  # the caller of `open_ray_provider`, past contextlib's __aenter__
        )
        return num_hosts
    if hosts is None:
        raise TypeError("open_ray_provider needs hosts, the number of host actors")
    return hosts


# ---- Ray's side: each runs in a worker thread (rule 5) ------------------------------------


def _create(count: int, options: dict[str, Any], arguments: dict[str, Any]) -> list[Any]:
    actor_class = ray.remote(HostActor).options(**options)
    return [actor_class.remote(**arguments) for _ in range(count)]


def _addresses(actors: list[Any], timeout: float) -> list[str]:
    """Rule 2."""
    try:
        addresses: list[str] = ray.get(
            [actor.address.remote() for actor in actors], timeout=timeout
        )
    except ray.exceptions.GetTimeoutError as error:
        raise HostLostError(f"code-mode host actors did not start within {timeout} s") from error
    except ray.exceptions.RayError as error:
        raise HostLostError(
            f"a code-mode host actor did not start: {_first_line(error)}"
        ) from error
    return addresses


async def _resolve(actors: list[Any], seconds: float, index: int) -> str:
    """Rule 3: the current address of actor `index`'s host."""
    return await trio.to_thread.run_sync(_address, actors[index], seconds, abandon_on_cancel=True)


def _address(actor: Any, timeout: float) -> str:
    try:
        address: str = ray.get(actor.address.remote(), timeout=timeout)
    except ray.exceptions.RayError as error:
        raise HostLostError(f"its Ray actor is unavailable: {_first_line(error)}") from error
    return address


def _stop(actors: list[Any]) -> None:
    """Rule 4."""
    deadline = time.monotonic() + STOP_TIMEOUT
    stops = [actor.stop.remote() for actor in actors]
    for actor, stop in zip(actors, stops, strict=True):
        try:
            ray.get(stop, timeout=max(0.0, deadline - time.monotonic()))
        except ray.exceptions.RayError as error:
            # Its host stops by itself once the actor is killed (`_actor.py`, rule 2).
            logger.info("a code-mode host actor did not stop its host: %s", _first_line(error))
        ray.kill(actor, no_restart=True)


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__
