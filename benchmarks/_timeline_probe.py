"""The probes of `timeline.py`: timestamps of one process's reads, writes and engine steps.

`Recorder` keeps `(label, perf_counter_ns)` pairs in memory (a list append per event: the
probe must not move what it measures) and writes them out as text lines `label ns`. The
clock is `CLOCK_MONOTONIC`, shared by every process of the machine, so the host's and the
client's events can be merged into one timeline.

Run as a host program (`python benchmarks/_timeline_probe.py {codemode,thin} LOG CELLS`), it
installs the host's probes and runs the codemode host or the thin host (`_thin_host.py`):
`r`/`w`, a read or write of the process; `s0`/`s1`, entering and leaving `Engine.start_cell`;
`d`, a batch of engine events dispatched; `i`, the trio thread out of work, entering trio's
epoll wait with a timeout (which returns at once if an event is ready). When the engine is
asked to start cell number `CELLS + 1`, it writes what it recorded to `LOG`.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


class Recorder:
    """Events of this process, in memory until `write`."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []
        self._recording = False
        self._unpatch: list[Callable[[], None]] = []

    def mark(self, label: str) -> None:
        """Record `label` now, if between `record_io` and `stop` (not, say, in a warm-up)."""
        if self._recording:
            self.events.append((label, time.perf_counter_ns()))

    def record_io(self, read_label: str, write_label: str) -> None:
        """Start recording: marks, and every `os.read` (when it returns) and `os.write` (when
        it is called)."""
        self._recording = True
        read, write = os.read, os.write
        mark = self.mark

        def probed_read(fd: int, size: int) -> bytes:
            data = read(fd, size)
            mark(read_label)
            return data

        def probed_write(fd: int, data: Any) -> int:
            mark(write_label)
            return write(fd, data)

        os.read, os.write = probed_read, probed_write
        self._unpatch.append(functools.partial(_restore_io, read, write))

    def stop(self) -> None:
        self._recording = False
        while self._unpatch:
            self._unpatch.pop()()

    def write(self, path: Path) -> None:
        path.write_text("".join(f"{label} {ns}\n" for label, ns in self.events))


def _restore_io(read: Callable[[int, int], bytes], write: Callable[[int, Any], int]) -> None:
    os.read, os.write = read, write


def read_log(path: Path) -> list[tuple[str, int]]:
    events = []
    for line in path.read_text().splitlines():
        label, ns = line.split()
        events.append((label, int(ns)))
    return events


def _probe_engine(recorder: Recorder, log: Path, cells: int) -> None:
    from codemode_host.engine import _engine

    start_cell = _engine.Engine.start_cell
    dispatch = _engine.Engine._dispatch
    started = 0

    def probed_start_cell(self: _engine.Engine, *args: Any, **kwargs: Any) -> Any:
        nonlocal started
        started += 1
        if started == cells + 1:
            recorder.write(log)
        recorder.mark("s0")
        cell = start_cell(self, *args, **kwargs)
        recorder.mark("s1")
        return cell

    def probed_dispatch(self: _engine.Engine, raw_events: Any) -> None:
        recorder.mark("d")
        dispatch(self, raw_events)

    _engine.Engine.start_cell = probed_start_cell  # type: ignore[method-assign]
    _engine.Engine._dispatch = probed_dispatch  # type: ignore[method-assign]


def _probe_idle(recorder: Recorder) -> None:
    from trio._core import _io_epoll

    get_events = _io_epoll.EpollIOManager.get_events

    def probed_get_events(self: _io_epoll.EpollIOManager, timeout: float) -> Any:
        if timeout > 0:
            recorder.mark("i")
        return get_events(self, timeout)

    _io_epoll.EpollIOManager.get_events = probed_get_events  # type: ignore[method-assign]


ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    host, log, cells = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    if str(ROOT) not in sys.path:  # run as a script, by a provider that starts it anywhere
        sys.path.insert(0, str(ROOT))
    recorder = Recorder()
    recorder.record_io("r", "w")
    _probe_engine(recorder, log, cells)
    _probe_idle(recorder)
    if host == "thin":
        import trio

        from benchmarks._thin_host import serve

        trio.run(serve)
    else:
        del sys.argv[1:]
        from codemode_host.__main__ import main as host_main

        host_main()


if __name__ == "__main__":
    main()
