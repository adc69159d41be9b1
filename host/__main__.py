"""`codemode-host` / `python -m codemode_host`: serve the protocol on stdin and stdout (or,
with `--listen`, on a socket: `_listen.py`).

`codemode-host --help` describes the options (`_options.py`); a bad option exits with status 2
before anything else happens.

Protocol bytes are the only thing on stdout: the process keeps private copies of fds 0 and 1
for the protocol and points fd 1 at stderr, so a stray `print()` (or C code writing to fd 1)
lands in the log, never in the frames. Logs go to stderr (level from `CODEMODE_HOST_LOG`,
default WARNING; `--log-level` overrides it).

The host exits when stdin closes, and when its parent *process* exits, watched through a pidfd
from the trio loop (also when the parent's stdin pipe stays open in another process). Not
`PR_SET_PDEATHSIG`: that fires when the parent *thread* that spawned the host exits, and trio
spawns processes from its worker-thread cache, whose idle threads exit after about ten seconds.
"""

from __future__ import annotations

import ctypes
import fcntl
import gc
import logging
import os
import sys
from collections.abc import Callable

import trio
from codemode_host._options import HostOptions, parse_options
from codemode_host.server import serve_connection

from codemode.errors import CodeModeError

_PIPE_SIZE = 1 << 20
GC_YOUNG_THRESHOLD = 50_000

# glibc's `mallopt` parameters (malloc.h), and the values the host sets (`_tune_allocator`):
# a block under 4 MiB comes from an arena, and an arena gives back the free memory at its top
# once there is more than 8 MiB of it. glibc's own adjustment goes up to 32 and 64 MiB, which
# the host once set: the workers' arenas then kept their top after the cells ended (the
# engine's `malloc_trim` does not shrink a thread's arena, only a free at its top does), and
# the host's RSS after 1,000 cells stayed 16-23 MiB above its start instead of 11.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 4 << 20
TRIM_THRESHOLD = 8 << 20


PARENT_VARIABLE = "CODEMODE_HOST_PARENT"
"""The pid of the client process, set by the process provider: the host watches that process
(also when a wrapper script forked it), and knows it even if the client died before the host
started."""


def _watch_parent() -> int | None:
    """A pidfd of the client process (None where pidfds do not exist); exits at once if the
    client is already gone."""
    named = os.environ.pop(PARENT_VARIABLE, "")
    parent = int(named) if named.isdigit() else os.getppid()
    try:
        pidfd = os.pidfd_open(parent)
    except ProcessLookupError:
        os._exit(0)  # the client died before the host started
    except (AttributeError, OSError):  # pragma: no cover - not Linux 5.3+
        return None
    if not named and os.getppid() != parent:  # the parent died before the pidfd was opened
        os._exit(0)
    return pidfd


def _grow_pipe(fd: int) -> None:
    # 1 MiB pipes move large frames in fewer wake-ups (design.md, engine 3).
    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
    except (OSError, AttributeError):
        pass


async def _serve(
    protocol_in: int, protocol_out: int, parent_pidfd: int | None, options: HostOptions
) -> int:
    receive = trio.lowlevel.FdStream(protocol_in)
    send = trio.lowlevel.FdStream(protocol_out)
    async with receive, send:
        return await serve_connection(
            receive,
            send,
            parent_pidfd=parent_pidfd,
            workers=options.workers,
            max_workers=options.max_workers,
            admission=options.admission,
        )


def _tune_garbage_collection() -> None:
    """Fewer, cheaper cyclic collections: every cell makes many short-lived containers, and
    the default threshold (700) ran a young collection every few cells. What start-up made
    (modules, classes) is frozen out of every later collection."""
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, 20, 20)


def _tune_allocator() -> None:
    """Fixed thresholds for glibc's allocator, so that a cell's freed memory stays in the
    arena of the worker that freed it for the next cell (docs/benchmarks.md, "Failed
    `isinstance` checks, and the host's allocator", and "Precise thread times, and the calls
    of one arrival" for the values).

    By default glibc starts by giving memory back on every `free` that leaves more than
    128 KiB free at the top of an arena (each worker thread has its own), and raises that
    threshold only once it freed a large block. Until it does, every cell's runtime memory
    went back to the system when freed and was faulted in again by the next cell: up to 15
    page faults and 40 us of the kernel's time a cell at 64 sessions, in some runs of the
    host and not others. Memory still goes back once the host is idle (the engine's trim).
    Not glibc (no `mallopt`): nothing to do."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        return
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)


def _nothing() -> None:
    pass


def _report_to_opentelemetry() -> Callable[[], None]:
    """`--otel`: the SDK set up from the `OTEL_*` variables; exits with status 2 and one line
    when it is not installed. Returns the flush to run before exiting (spans are batched)."""
    from codemode.observability import install_from_environment, install_log_filter

    try:
        flush = install_from_environment("codemode-host")
    except CodeModeError as error:
        sys.stderr.write(f"codemode-host: error: {error}\n")
        sys.stderr.flush()
        os._exit(2)
    install_log_filter()
    return flush


def main() -> None:
    options = parse_options()
    logging.basicConfig(
        stream=sys.stderr,
        level=options.log_level,
        format="codemode-host %(levelname)s %(name)s: %(message)s",
    )
    flush_telemetry = _report_to_opentelemetry() if options.otel else _nothing
    _tune_allocator()
    if options.listen is not None:
        from codemode_host._listen import run_listening

        status = run_listening(options)
        flush_telemetry()
        sys.stderr.flush()
        os._exit(status)
    parent_pidfd = _watch_parent()
    protocol_in, protocol_out = os.dup(0), os.dup(1)
    os.dup2(2, 1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    for fd in (protocol_in, protocol_out):
        _grow_pipe(fd)
    _tune_garbage_collection()
    status = trio.run(_serve, protocol_in, protocol_out, parent_pidfd, options)
    flush_telemetry()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: the engine's threads are joined and the frames flushed.
    os._exit(status)


if __name__ == "__main__":
    main()
