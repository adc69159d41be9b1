"""`codemode-host --listen ADDRESS`: the protocol over a socket, one connection per client.

Each accepted connection is served by `serve_connection` exactly as stdin/stdout is, with its
own sessions and its own admission limits; all of them share one engine (one pool of native
workers, one heap budget).

Rules:
1. Once the socket listens, the host prints exactly one line on stdout, `codemode-host
   listening on ADDRESS` with the address it is bound to (the real port), and flushes; then fd
   1 points at stderr, so nothing else ever lands on stdout (a launcher parses that line).
2. Who may connect (`_listen_options.py`, `HostConnection` rule 8): with a token, a hello
   without it (or with another) is refused and the connection closed; the hello must name
   this host's codemode version. A TCP connection has keepalive on with short timers
   (`codemode._trio._sockets`), so a client that vanished without a word is noticed.
3. A client that goes away (a goodbye, a protocol error, or a cut it did not resume in time)
   loses its sessions: their cells are terminated, their reverse calls cancelled; the host
   keeps serving the others. One client's failure never ends another's connection.
4. SIGTERM or SIGINT (or the death of the process named by `CODEMODE_HOST_PARENT`, when set)
   stops the host: it stops accepting, every connection is served to its end as if its
   client had closed it (sessions shut down, bounded), the socket is closed (a Unix socket's
   file removed) and the host exits with status 0.
5. Connections are bounded (`_listen_limits.py`): a connection must complete its hello within
   `--hello-timeout`; at most `--max-waiting-connections` wait for theirs (a new one past it
   evicts the oldest) and at most `--max-connections` clients are in (one more is closed after
   its hello). Each closing is logged with its reason. At start the host raises its soft limit
   on open descriptors to the hard one.
6. A client's connection whose stream is cut (end of file without a goodbye, a reset, a
   silent client) keeps its sessions, cells and pending calls for `--resume-grace` (default
   30 s): the client reconnects and resumes it (`_resume.py`, `server.py`); past the grace they
   are freed as in rule 3. A stream that resumes a connection serves it and is not a client
   of its own.
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import sys
from collections.abc import AsyncIterator, Callable
from functools import partial
from importlib.metadata import PackageNotFoundError, version

import trio
from codemode_host._listen_limits import ConnectionBook
from codemode_host._listen_options import ListenSettings
from codemode_host._options import HostOptions
from codemode_host._resume import ResumeDesk
from codemode_host.engine import Engine, open_engine
from codemode_host.runtime import worker_ceiling
from codemode_host.server import SHUTDOWN_TIMEOUT, serve_connection

from codemode import AdmissionLimits
from codemode._trio._sockets import HostAddress, keep_alive, open_listener

logger = logging.getLogger("codemode.host")

PARENT_VARIABLE = "CODEMODE_HOST_PARENT"
TLS_HANDSHAKE_TIMEOUT = 10.0
STOP_TIMEOUT = 2 * SHUTDOWN_TIMEOUT + 1.0
"""Seconds every connection has to end once the host stops (rule 4): its sessions' shutdown
and its last frames, each bounded by `SHUTDOWN_TIMEOUT`."""


def codemode_version() -> str:
    """The version a client's hello must name: this installation's."""
    try:
        return version("codemode")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree
        return "unknown"


def run_listening(options: HostOptions) -> int:
    """Serve `options.listen` until stopped (rule 4); the exit status."""
    assert options.listen is not None
    _raise_descriptor_limit()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # nothing reads stdin: a listening host is nobody's child
    os.close(devnull)
    return trio.run(serve_listening, options.listen, options, _parent_pidfd())


def _raise_descriptor_limit() -> None:
    """Rule 5: every connection holds a descriptor; the soft limit (often 1,024) is not the
    machine's."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as error:  # pragma: no cover - a hard limit we cannot take
            logger.warning(
                "could not raise the open-file limit from %d to %d: %s", soft, hard, error
            )


def _parent_pidfd() -> int | None:
    """A pidfd of the process `CODEMODE_HOST_PARENT` names (None: none named, or gone)."""
    named = os.environ.pop(PARENT_VARIABLE, "")
    if not named.isdigit():
        return None
    try:
        return os.pidfd_open(int(named))
    except ProcessLookupError:
        sys.exit(0)  # the process that started the host is gone already
    except (AttributeError, OSError):  # pragma: no cover - not Linux 5.3+
        return None


async def serve_listening(
    settings: ListenSettings, options: HostOptions, parent_pidfd: int | None = None
) -> int:
    """Listen, announce (rule 1), serve every client, stop on a signal (rule 4)."""
    try:
        listener, bound = await open_listener(settings.address)
    except OSError as error:
        where = settings.address
        print(f"codemode-host: error: cannot listen on {where}: {error}", file=sys.stderr)
        return 1
    admission = options.admission
    max_workers = options.max_workers or worker_ceiling(admission)
    serve = partial(
        _serve_client,
        settings=settings,
        admission=admission,
        codemode_version=codemode_version(),
        book=ConnectionBook(
            max_waiting=settings.max_waiting_connections,
            max_connections=settings.max_connections,
        ),
        resumes=ResumeDesk(settings.resume_grace) if settings.resume_grace > 0 else None,
    )
    try:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with (
                open_engine(
                    workers=options.workers, max_workers=max_workers, release_when_idle=True
                ) as engine,
                trio.open_nursery() as clients,
            ):
                stop = trio.Event()
                with trio.CancelScope() as accepting:
                    async with trio.open_nursery() as watchers:
                        watchers.start_soon(_cancel_on_signal, signals, accepting)
                        if parent_pidfd is not None:
                            watchers.start_soon(_cancel_with_parent, parent_pidfd, accepting)
                        _announce(bound)
                        await trio.serve_listeners(
                            partial(serve, engine=engine, stop=stop),
                            [listener],
                            handler_nursery=clients,
                        )
                stop.set()
                clients.cancel_scope.deadline = trio.current_time() + STOP_TIMEOUT
    finally:
        with trio.CancelScope(shield=True):
            await listener.aclose()
        if bound.scheme == "unix":
            _remove(bound.path)
    return 0


def _announce(bound: HostAddress) -> None:
    """Rule 1."""
    print(f"codemode-host listening on {bound}", flush=True)
    os.dup2(2, 1)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


async def _cancel_on_signal(signals: AsyncIterator[int], scope: trio.CancelScope) -> None:
    async for signum in signals:
        logger.warning("%s: stopping", signal.Signals(signum).name)
        scope.cancel()
        return


async def _cancel_with_parent(pidfd: int, scope: trio.CancelScope) -> None:
    await trio.lowlevel.wait_readable(pidfd)
    logger.warning("the process that started the code-mode host exited; stopping")
    scope.cancel()


async def _serve_client(
    stream: trio.SocketStream,
    *,
    settings: ListenSettings,
    admission: AdmissionLimits,
    codemode_version: str,
    engine: Engine,
    stop: trio.Event,
    book: ConnectionBook,
    resumes: ResumeDesk | None,
) -> None:
    """Serve one accepted connection to its end (rules 2, 3, 5 and 6)."""
    peer = _peer(stream)
    logger.info("client %s connected", peer)
    keep_alive(stream.socket)
    with trio.CancelScope() as evicted:
        key = book.arrived(peer, evicted)
        try:
            await _serve_stream(
                stream,
                peer,
                settings,
                admission,
                codemode_version,
                engine,
                stop,
                partial(book.ready, key),
                resumes,
                partial(book.handed_over, key),
            )
        finally:
            book.left(key)


async def _serve_stream(
    stream: trio.SocketStream,
    peer: str,
    settings: ListenSettings,
    admission: AdmissionLimits,
    codemode_version: str,
    engine: Engine,
    stop: trio.Event,
    on_ready: Callable[[], bool],
    resumes: ResumeDesk | None,
    on_handed_over: Callable[[], None],
) -> None:
    """Serve the connection (over TLS when configured); whatever fails, it is closed."""
    served: trio.abc.Stream = stream
    try:
        if settings.ssl_context is not None:
            served = tls = trio.SSLStream(stream, settings.ssl_context, server_side=True)
            try:
                with trio.fail_after(TLS_HANDSHAKE_TIMEOUT):
                    await tls.do_handshake()
            except (trio.BrokenResourceError, trio.TooSlowError) as error:
                cause = error.__cause__ or error
                logger.warning("client %s: TLS handshake failed: %s", peer, cause)
                return
        status = await serve_connection(
            served,
            served,
            engine=engine,
            admission=admission,
            token=settings.token,
            codemode_version=codemode_version,
            stop=stop,
            inventory_signal=False,  # per connection, the signal handlers would nest badly
            hello_timeout=settings.hello_timeout,
            on_ready=on_ready,
            resumes=resumes,
            on_handed_over=on_handed_over,
        )
        logger.info("client %s disconnected (status %d)", peer, status)
    except Exception:
        # Rule 3: whatever went wrong went wrong for this client only; the others keep
        # their connections (trio would cancel every sibling task if this escaped).
        logger.exception("serving client %s failed", peer)
    finally:
        await trio.aclose_forcefully(served)


def _peer(stream: trio.SocketStream) -> str:
    try:
        name = stream.socket.getpeername()
    except OSError:
        return "(gone)"
    if isinstance(name, tuple):
        return f"{name[0]}:{name[1]}"
    return "unix"
