"""Reading processes and threads from /proc (Linux): CPU time per thread, resident memory, and
the host process among this process's children. No psutil: only what the kernel prints.

Threads are put in one of three components by what they are:
- "trio": the process's main thread (tid == pid), where the trio loop runs;
- "engine workers": the engine's native threads, which name themselves `codemode-...`
  (`codemode-worker`, and the preparer and the monitor, engine rule 13);
- "other threads": the rest, like trio's thread cache (`Trio thread N`, or `<function> from
  <task>` while it runs a job: `trio.to_thread`, process spawns).
A living thread's time is read from its `schedstat` (nanoseconds), not from the 10 ms clock
ticks of its `stat`. A thread that exited during a measurement took its CPU time out of
/proc/<pid>/task; what the whole process used (/proc/<pid>/stat, in ticks) minus the living
threads' ticks is reported as "exited threads".
"""

from __future__ import annotations

import os
from pathlib import Path

TICK_US = 1e6 / os.sysconf("SC_CLK_TCK")

COMPONENTS = ("trio", "engine workers", "other threads", "exited threads")


def _cpu_ticks(stat_path: Path) -> int:
    """utime + stime of a /proc stat file, in clock ticks."""
    text = stat_path.read_text()
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])  # fields 14 and 15 of proc(5)


def _thread_cpu_us(task: Path, ticks: int) -> float:
    """A living thread's CPU time in microseconds: from its `schedstat` (nanoseconds on the
    CPU), or from its clock ticks where the kernel keeps no such file.

    Ticks are 10 ms: over a half-second window of a few thousand cells, one tick more or less
    at either end moved a component by about 4 us a cell (`paired_cpu.py`)."""
    try:
        return int((task / "schedstat").read_text().split()[0]) / 1000
    except (OSError, ValueError, IndexError):
        return ticks * TICK_US


ENGINE_THREAD_PREFIX = "codemode-"


def _component(pid: int, tid: int, task: Path) -> str:
    if tid == pid:
        return "trio"
    try:
        comm = (task / "comm").read_text()
    except OSError:
        return "exited threads"
    return "engine workers" if comm.startswith(ENGINE_THREAD_PREFIX) else "other threads"


def _status_value(status: Path, field: str) -> int:
    """The number after `field:` in a /proc status file (kB for sizes).

    Raises:
        LookupError: the file has no such field.
    """
    for line in status.read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise LookupError(f"no {field} in {status}")


class CpuSample:
    """CPU time of one process at one moment, per thread and in total (microseconds), and how
    often its trio thread had been preempted."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.total = _cpu_ticks(Path(f"/proc/{pid}/stat")) * TICK_US
        self.threads: dict[int, tuple[str, float]] = {}
        # The living threads' ticks, beside their precise times: the exited threads' time is
        # the process's ticks less these, both in the same unit.
        self.thread_ticks: dict[int, float] = {}
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                ticks = _cpu_ticks(task / "stat")
            except (OSError, ValueError):
                continue  # the thread exited while we looked
            tid = int(task.name)
            self.threads[tid] = (_component(pid, tid, task), _thread_cpu_us(task, ticks))
            self.thread_ticks[tid] = ticks * TICK_US
        # How often the kernel took the CPU from the trio thread while it could still run.
        trio_status = Path(f"/proc/{pid}/task/{pid}/status")
        self.trio_preempted = _status_value(trio_status, "nonvoluntary_ctxt_switches")


def cpu_by_component(before: CpuSample, after: CpuSample) -> dict[str, float]:
    """Microseconds of CPU each component used between two samples of the same process."""
    used = dict.fromkeys(COMPONENTS, 0.0)
    for tid, (component, end) in after.threads.items():
        start = before.threads.get(tid, (component, 0.0))[1]
        used[component] += end - start
    living = sum(end - before.thread_ticks.get(tid, 0.0) for tid, end in after.thread_ticks.items())
    used["exited threads"] = max(0.0, (after.total - before.total) - living)
    return used


def rss_bytes(pid: int) -> int:
    """Resident set size of `pid` (VmRSS of /proc/<pid>/status)."""
    return _status_value(Path(f"/proc/{pid}/status"), "VmRSS") * 1024


def children() -> list[int]:
    """This process's child processes (every thread's: trio spawns from worker threads)."""
    found: list[int] = []
    for task in Path("/proc/self/task").iterdir():
        try:
            found += [int(pid) for pid in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def child_running(marker: str) -> int:
    """The pid of the newest child whose command line contains `marker` (`codemode_host`):
    the host of the provider opened last (in a test run, an earlier test's host may still be
    exiting).

    Raises:
        LookupError: no such child.
    """
    matches: list[tuple[int, int]] = []
    for pid in children():
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if marker in command:
            started = int(stat[stat.rindex(")") + 2 :].split()[19])  # field 22 of proc(5)
            matches.append((started, pid))
    if not matches:
        raise LookupError(f"no child process running {marker!r}")
    return max(matches)[1]
