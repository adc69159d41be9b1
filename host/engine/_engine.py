"""The trio side of the engine: its collector task, its alarms, and its release when idle.

`open_engine()` starts the extension's worker threads and a single trio task that waits on the
extension's eventfd, drains the events of all cells in one batch and hands each cell its own.
Each cell's handle is an `EngineCell` (`_cell.py`): its events, and the commands it answers
with, without a thread hand-off per JavaScript turn. `call_after_dispatch` lets a handler have
something done once the whole batch is handed out, still in the collector's step.

`Engine.alarms` keeps the deadlines of those who use the engine's cells (an observation's
window, a terminated turn's last moment) in one task of the engine (`codemode._trio.Alarms`):
a cancel scope per deadline cost a cell about as much as a pass of the scheduler.

Resource handling: `open_engine` closes the engine on exit, which interrupts every cell still
running and joins the worker threads, shielded from cancellation.

Memory after a burst (`open_engine(release_when_idle=True)`, the host's engine): once
`RELEASE_AFTER_CELLS` cells closed and no cell was live nor started for `IDLE_RELEASE_SECONDS`,
a task calls the functions given to `on_release` (the host's drop their parked worker tasks),
lets the tasks they woke end, collects Python's cyclic garbage (`gc.collect()`, on the trio
thread) and trims (`trim()`, in a thread). The extension's own trim (its rule 10) runs as the
last cell is freed, before the objects that served the cells are: the host raises the young
collection's threshold to 50,000 allocations, and a thousand terminated cells left about 6 MiB
of cycles that pinned pymalloc arenas until the next collection.
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import NoReturn

import msgspec
import trio

from codemode._trio import Alarms, open_service_nursery

from .. import _quickjs
from ._cell import EngineCell
from ._events import RawEvent, decode_event

logger = logging.getLogger("codemode.engine")

EngineClosedError = _quickjs.EngineClosedError
MAX_STACK_LIMIT = _quickjs.MAX_STACK_LIMIT
DEFAULT_STACK_LIMIT = _quickjs.DEFAULT_STACK_LIMIT

DEFAULT_MAX_WORKERS = 64
MAX_WORKERS = 1024
"""The most worker threads an engine may have (the binding's bound)."""
"""Worker threads the engine may grow to while cells that compute for long hold the others."""


IDLE_RELEASE_SECONDS = 1.0
"""How long an engine that releases memory when idle waits with no cell live nor started: long
enough for what follows a burst of cells without starting one (a client shutting its
sessions down: 1,000 took about 0.1 s) to be over, so that its garbage is collected too."""
ENGINE_THREADS = 4
"""Threads the engine's own blocking calls (its waits, its trims, its close) may hold at once."""
RELEASE_AFTER_CELLS = 100
"""Cells closed since the last release before the next one: fewer leave little to give back,
and each release is a full collection on the trio thread."""


def default_heap_budget() -> int:
    """Half of the machine's memory: the most all cells of one engine may hold together."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2


_PRELUDE = Path(__file__).with_name("prelude.js").read_bytes()
_PRELUDE_IMAGES = Path(__file__).with_name("prelude_images.js").read_bytes()


class CellTool(msgspec.Struct, frozen=True):
    """A nested tool as a cell sees it: `tools[name]` and its `ALL_TOOLS` entry.

    Parameters:
        name: the JavaScript identifier (already normalised by the caller).
        description: the text shown in `ALL_TOOLS`.
    """

    name: str
    description: str = ""


class _CellConfig(msgspec.Struct, frozen=True):
    tools: Sequence[CellTool]
    stored: Mapping[str, str]
    store_load: bool
    stored_limit: int


_encode_config = msgspec.json.Encoder().encode


class Engine:
    """The engine's worker threads and the event collector; made by `open_engine()`."""

    def __init__(self, native: _quickjs.Engine) -> None:
        self._native = native
        self._cells: dict[int, EngineCell] = {}
        self._next_key = 1
        self._closed_since_release = 0
        self._release_due = trio.Event()
        self._before_release: list[Callable[[], None]] = []
        self._dispatching = False
        self._after_dispatch: list[Callable[[], None]] = []
        self.alarms = Alarms()
        """The deadlines of the cells' users, run in the engine's own task (rule 1 of
        `codemode._trio.Alarms`: a function that does not block)."""
        # The engine's own waits and its close take threads of their own, never trio's default
        # limiter: an application (or its tools) holding all of those must not keep the engine
        # from closing.
        self._threads = trio.CapacityLimiter(ENGINE_THREADS)

    @property
    def live_cells(self) -> int:
        """Cells whose runtime is not yet freed (a leak check for tests)."""
        return self._native.live_cells

    @property
    def heap_total(self) -> int:
        """Bytes of JavaScript heap all cells hold together (the budget's measure)."""
        return self._native.heap_total

    @property
    def prepared_cells(self) -> int:
        """Runtimes prepared ahead of use and not yet taken by a cell."""
        return self._native.prepared_cells

    @property
    def prepared_taken(self) -> int:
        """Cells that started on a prepared runtime."""
        return self._native.prepared_taken

    async def wait_prepared(self, seconds: float = 10.0) -> bool:
        """Wait until the pool of prepared runtimes is full (False: not within `seconds`, or a
        preparation failed for lack of memory). The wait in its thread cannot be cancelled:
        `seconds` bounds it."""
        return await trio.to_thread.run_sync(
            self._native.wait_prepared, seconds, limiter=self._threads
        )

    @property
    def trims(self) -> int:
        """Times the engine gave freed memory back to the system: an idle worker does once no
        cell is live and cells freed 16 MiB of heap since the last time."""
        return self._native.trims

    def on_release(self, drop: Callable[[], None]) -> None:
        """Call `drop()` before each release of memory when idle (`release_when_idle`): what
        it lets go of, and what the tasks it wakes leave behind when they end, is collected
        with the rest. It must not block nor raise."""
        self._before_release.append(drop)

    def forget_release(self, drop: Callable[[], None]) -> None:
        """`drop` is no longer called (its owner ended: a connection of a listening host,
        whose engine outlives it, must not be kept alive by it)."""
        if drop in self._before_release:
            self._before_release.remove(drop)

    @property
    def release_hooks(self) -> int:
        """How many `on_release` callbacks are registered (for leak checks)."""
        return len(self._before_release)

    def call_after_dispatch(self, fn: Callable[[], None]) -> bool:
        """While the collector hands a batch of events to the cells' handlers: `fn()` runs once
        the whole batch is handed out, in the same step (True). Anywhere else nothing is
        scheduled (False). What `fn` raises is logged: the collector serves every cell."""
        if self._dispatching:
            self._after_dispatch.append(fn)
        return self._dispatching

    async def wait_trimmed(self, after: int, seconds: float = 10.0) -> int:
        """Wait until more than `after` trims happened (or `seconds` passed); the trims so
        far. The wait in its thread cannot be cancelled: `seconds` bounds it."""
        return await trio.to_thread.run_sync(
            self._native.wait_trimmed, after, seconds, limiter=self._threads
        )

    @property
    def worker_threads(self) -> int:
        """Native worker threads started so far (the pool grows when cells starve)."""
        return self._native.worker_threads

    def start_cell(
        self,
        source: str,
        *,
        tools: Sequence[CellTool] = (),
        stored_values: Mapping[str, bytes] | None = None,
        heap_limit: int | None = None,
        stack_limit: int | None = None,
        store_load: bool = True,
        cpu_limit_ms: int | None = None,
        output_limit: int | None = None,
        stored_value_limit: int | None = None,
    ) -> EngineCell:
        """Create a cell and queue its start; its events follow through `next_events`.

        Args:
            source: the cell's JavaScript, evaluated as an ES module.
            tools: the nested tools, in `ALL_TOOLS` order.
            stored_values: what `load` sees at the start, each value as JSON text.
            heap_limit: bytes the cell's runtime may allocate (None: no limit).
            stack_limit: bytes of JS stack (None: `DEFAULT_STACK_LIMIT`; at most
                `MAX_STACK_LIMIT`).
            store_load: False leaves `store` and `load` out of the cell's globals.
            cpu_limit_ms: CPU time the cell's turns may use (None: no limit); past it the cell
                finishes with `Outcome.CPU_LIMIT`.
            output_limit: bytes of output (`item_bytes` of each text and image) published and
                not yet taken (`output_taken`) past which `text()` and `image()` throw (None:
                no limit).
            stored_value_limit: characters of keys and JSON texts the stored values may take,
                as this cell sees them; past it `store()` throws (None: no limit).

        Raises:
            ValueError: a limit out of range.
            EngineClosedError: the engine is closed.
        """
        if heap_limit is not None and heap_limit <= 0:
            raise ValueError(f"heap_limit must be a positive number of bytes, got {heap_limit}")
        if stack_limit is not None and not 0 < stack_limit <= MAX_STACK_LIMIT:
            raise ValueError(
                f"stack_limit must be between 1 and {MAX_STACK_LIMIT} bytes, got {stack_limit}"
            )
        stored = {key: value.decode() for key, value in (stored_values or {}).items()}
        config = _encode_config(
            _CellConfig(
                tools=tools,
                stored=stored,
                store_load=store_load,
                stored_limit=stored_value_limit or 0,
            )
        )
        key = self._next_key
        self._next_key += 1
        native = self._native.start_cell(
            key,
            source.encode(errors="surrogatepass"),
            config,
            heap_limit or 0,
            stack_limit or 0,
            cpu_limit_ms or 0,
            output_limit or 0,
        )
        cell = EngineCell(native, self._forget)
        self._cells[key] = cell
        return cell

    def _forget(self, key: int) -> None:
        if self._cells.pop(key, None) is not None:
            self._closed_since_release += 1
            if self._closed_since_release == RELEASE_AFTER_CELLS:
                self._release_due.set()

    async def _release_when_idle(self) -> NoReturn:
        while True:
            await self._release_due.wait()
            started = -1
            while self._cells or self._next_key != started:
                started = self._next_key
                await trio.sleep(IDLE_RELEASE_SECONDS)
            self._closed_since_release = 0
            self._release_due = trio.Event()
            for drop in self._before_release:
                drop()
            # Two passes: the tasks the hooks woke run (and end) in the first.
            await trio.lowlevel.checkpoint()
            await trio.lowlevel.checkpoint()
            gc.collect()
            await trio.to_thread.run_sync(self._native.trim, limiter=self._threads)

    def _dispatch(self, raw_events: list[RawEvent]) -> None:
        cells = self._cells
        self._dispatching = True
        try:
            for key, kind, n1, n2, a, b in raw_events:
                cell = cells.get(key)
                if cell is not None:
                    cell._deliver(decode_event(kind, n1, n2, a, b))
        finally:
            self._dispatching = False
        if self._after_dispatch:
            after, self._after_dispatch = self._after_dispatch, []
            for fn in after:
                try:
                    fn()
                except Exception:
                    logger.exception("a function run after the engine's events raised")

    async def _collect(self) -> NoReturn:
        fd = self._native.fileno()
        while True:
            await trio.lowlevel.wait_readable(fd)
            self._dispatch(self._native.drain())


def default_workers() -> int:
    """One worker per core this process may run on."""
    return len(os.sched_getaffinity(0)) or 1


@asynccontextmanager
async def open_engine(
    *,
    workers: int | None = None,
    max_workers: int = DEFAULT_MAX_WORKERS,
    fault_events_after: int | None = None,
    heap_budget: int | None = None,
    prepared_cells: int | None = None,
    release_when_idle: bool = False,
) -> AsyncIterator[Engine]:
    """Start the engine's worker threads and its event collector for the block's duration.

    Args:
        workers: native worker threads to start with (default: one per core).
        max_workers: the most the pool grows to when every worker is held by a cell that
            computes for long and other cells wait (QuickJS cannot preempt a turn).
        fault_events_after: fault injection for tests: after this many events, publishing an
            event fails as it would without memory (the cell then finishes with an error
            instead of hanging). None: never.
        heap_budget: the most JavaScript heap all cells may hold together; an allocation past
            it fails its cell (None: `default_heap_budget()`, half the machine's memory).
        prepared_cells: runtimes a preparer thread makes ahead of use (context and prelude
            ready), with CPU nobody else wants (SCHED_IDLE), so that starting a cell does not
            wait for its runtime's creation (None: one per worker; 0: none, and no preparer
            thread). Each holds about 200 KB.
        release_when_idle: after a burst of cells, once idle, collect Python's garbage and
            give freed memory back (the module's docstring); for a process that serves only
            cells (the host), not for an application's (the in-process provider).

    Resource handling: on exit, every cell still running is interrupted and the worker
    threads are joined (shielded: a cancelled block still waits for the threads).
    """
    workers = workers or default_workers()
    native = _quickjs.Engine(
        workers,
        _PRELUDE,
        _PRELUDE_IMAGES,
        max(max_workers, workers),
        -1 if fault_events_after is None else fault_events_after,
        default_heap_budget() if heap_budget is None else heap_budget,
        workers if prepared_cells is None else prepared_cells,
    )
    engine = Engine(native)
    try:
        async with open_service_nursery() as nursery:
            nursery.start_soon(engine._collect)
            nursery.start_soon(engine.alarms.run)
            if release_when_idle:
                nursery.start_soon(engine._release_when_idle)
            try:
                yield engine
            finally:
                nursery.cancel_scope.cancel()
    finally:
        trio.lowlevel.notify_closing(native.fileno())
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(native.close, limiter=engine._threads)
