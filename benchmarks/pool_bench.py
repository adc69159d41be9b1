"""Pool figures: `open_process_provider(hosts=N)` for N = 1, 2, 4, side by side, with one host
(the default provider) as the baseline of the same run.

Each run: 64 sessions, each running one-tool cells back to back for a few seconds. Printed per
run: cells/s (and its ratio to one host), the spread of sessions over the hosts, and per host
the cells it served, its CPU time (utime + stime from `/proc/<pid>/stat`) and cells per host
CPU-second; then the client's CPU per cell and the hosts' CPU per cell.

On a machine with as many cores as the client and its hosts can use, a pool is faster; on a
2-core machine it cannot be (`docs/design.md`, "A pool on two cores"): there the figures to judge
are no loss against one host, flat cells per host CPU-second, and an even spread. The expected
speed-up on bigger machines is then stated from the measured CPU per cell:

    cells/s(N hosts, C cores) ~ min(C / (client + hosts' CPU per cell),    every core busy
                                    1 / client trio thread's CPU per cell, one client loop
                                    N / a host trio thread's CPU per cell) one loop per host

(a trio thread is a process's main thread, read from `/proc/<pid>/task/<pid>/stat`; the
engine's workers run beside it). It ignores what the client's and hosts' threads cost each
other beyond CPU (GIL hand-offs, caches), so measure where more cores are at hand.

Run: `python benchmarks/pool_bench.py [--seconds S] [--rounds R]`.
"""

from __future__ import annotations

import argparse
import os
import resource
import time

import trio

import codemode
from codemode import ExecuteRequest, JsonValue, NestedToolCall, Session, ToolDefinition, ToolName
from codemode.process import ProcessProvider

SESSIONS = 64
POOLS = (1, 2, 4)
TOOL = ToolDefinition(name="t", tool_name=ToolName.plain("t"))
REQUEST = ExecuteRequest(
    tool_call_id="c", source="text((await tools.t({})).value)", enabled_tools=[TOOL]
)
TICKS = os.sysconf("SC_CLK_TCK")


class Delegate:
    async def invoke_tool(self, call: NestedToolCall) -> JsonValue:
        return {"value": "output"}

    async def notify(self, call_id: str, cell_id: str, text: str) -> None:
        pass

    def cell_closed(self, cell_id: str) -> None:
        pass


DELEGATE = Delegate()


def cpu(path: str) -> float:
    """utime + stime, in seconds, of a `/proc/.../stat` file (its fields 14 and 15)."""
    with open(path) as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def process_cpu(pid: int) -> float:
    """A process's CPU time, every thread."""
    return cpu(f"/proc/{pid}/stat")


def main_thread_cpu(pid: int) -> float:
    """The CPU time of a process's main thread: the trio thread, for the client and a host
    (the engine's workers are other threads)."""
    return cpu(f"/proc/{pid}/task/{pid}/stat")


def client_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Run:
    """One pool's figures."""

    def __init__(self, hosts: int) -> None:
        self.hosts = hosts
        self.seconds = 0.0
        self.spread: list[int] = []
        self.served: list[int] = []
        self.host_cpu: list[float] = []
        self.host_trio_cpu: list[float] = []
        self.client_cpu = 0.0
        self.client_trio_cpu = 0.0

    @property
    def cells(self) -> int:
        return sum(self.served)

    @property
    def rate(self) -> float:
        return self.cells / self.seconds

    def per_host_cpu_second(self) -> list[float]:
        return [
            cells / seconds if seconds else 0.0
            for cells, seconds in zip(self.served, self.host_cpu, strict=True)
        ]

    @property
    def host_cpu_per_cell(self) -> float:
        return sum(self.host_cpu) / self.cells

    @property
    def client_cpu_per_cell(self) -> float:
        return self.client_cpu / self.cells

    @property
    def host_trio_cpu_per_cell(self) -> float:
        return sum(self.host_trio_cpu) / self.cells

    @property
    def client_trio_cpu_per_cell(self) -> float:
        return self.client_trio_cpu / self.cells


async def place(provider: ProcessProvider) -> tuple[list[Session], list[int]]:
    """64 sessions, and the host each was placed on (seen in the provider's statistics)."""
    sessions: list[Session] = []
    where: list[int] = []
    for _ in range(SESSIONS):
        before = [host.sessions for host in provider.statistics().hosts]
        sessions.append(await provider.create_session())
        after = [host.sessions for host in provider.statistics().hosts]
        (index,) = [i for i, (b, a) in enumerate(zip(before, after, strict=True)) if a == b + 1]
        where.append(index)
    return sessions, where


async def drive(sessions: list[Session], seconds: float) -> tuple[list[int], float]:
    """Every session runs cells back to back for `seconds`: the cells of each, the wall time."""
    counts = [0] * len(sessions)
    start = time.perf_counter()
    deadline = start + seconds

    async def loop(index: int, session: Session) -> None:
        while time.perf_counter() < deadline:
            started = await session.execute(REQUEST, DELEGATE)
            await started.initial_response()
            counts[index] += 1

    async with trio.open_nursery() as nursery:
        for index, session in enumerate(sessions):
            nursery.start_soon(loop, index, session)
    return counts, time.perf_counter() - start


async def measure(hosts: int, seconds: float) -> Run:
    run = Run(hosts)
    async with codemode.open_process_provider(hosts=hosts) as provider:
        sessions, where = await place(provider)
        await drive(sessions, min(1.0, seconds))  # warm-up
        found = [host.pid for host in provider.statistics().hosts]
        pids = [pid for pid in found if pid is not None]
        assert len(pids) == hosts
        me = os.getpid()
        cpu_before = [process_cpu(pid) for pid in pids]
        trio_before = [main_thread_cpu(pid) for pid in pids]
        client_before, client_trio_before = client_cpu(), main_thread_cpu(me)
        counts, run.seconds = await drive(sessions, seconds)
        run.client_cpu = client_cpu() - client_before
        run.client_trio_cpu = main_thread_cpu(me) - client_trio_before
        run.host_cpu = [process_cpu(pid) - b for pid, b in zip(pids, cpu_before, strict=True)]
        run.host_trio_cpu = [
            main_thread_cpu(pid) - b for pid, b in zip(pids, trio_before, strict=True)
        ]
        run.spread = [where.count(index) for index in range(hosts)]
        run.served = [
            sum(count for count, host in zip(counts, where, strict=True) if host == index)
            for index in range(hosts)
        ]
    return run


def expected(run: Run, hosts: int, cores: int) -> float:
    """cells/s on `cores` cores with `hosts` hosts, from `run`'s CPU per cell (docstring)."""
    per_cell = run.client_cpu_per_cell + run.host_cpu_per_cell
    return min(
        cores / per_cell, 1 / run.client_trio_cpu_per_cell, hosts / run.host_trio_cpu_per_cell
    )


def report(runs: list[Run], seconds: float) -> None:
    base = runs[0]
    base_flat = base.per_host_cpu_second()[0]
    print(f"{SESSIONS} sessions of one-tool cells, {seconds:g} s per pool, {os.cpu_count()} cores")
    for run in runs:
        flat = run.per_host_cpu_second()
        mean = sum(flat) / len(flat)
        print(
            f"hosts={run.hosts}: {run.rate:6.0f} cells/s (x{run.rate / base.rate:.2f} of 1 host)"
            f"  sessions per host {run.spread}  cells per host {run.served}"
        )
        print(
            f"         host CPU s {[round(seconds, 2) for seconds in run.host_cpu]}"
            f"  cells per host CPU-s {[round(value) for value in flat]}"
            f" (mean {mean:.0f}, x{mean / base_flat:.2f} of 1 host)"
        )
        print(
            f"         CPU per cell: client {run.client_cpu_per_cell * 1e6:.0f} us"
            f" (trio thread {run.client_trio_cpu_per_cell * 1e6:.0f}),"
            f" hosts {run.host_cpu_per_cell * 1e6:.0f} us"
            f" (trio threads {run.host_trio_cpu_per_cell * 1e6:.0f})"
        )
    print("expected cells/s on bigger machines, from the 1-host run's CPU per cell:")
    for machine in (4, 8, 16):
        figures = [expected(base, hosts, machine) for hosts in POOLS]
        cells = "  ".join(
            f"hosts={hosts} {rate:6.0f} (x{rate / figures[0]:.2f})"
            for hosts, rate in zip(POOLS, figures, strict=True)
        )
        print(f"  {machine:2} cores: {cells}")
    print(
        f"  bounds: one host's trio thread {1 / base.host_trio_cpu_per_cell:.0f} cells/s,"
        f" the client's trio thread {1 / base.client_trio_cpu_per_cell:.0f} cells/s"
    )


async def main(seconds: float, rounds: int) -> None:
    for _ in range(rounds):
        runs = [await measure(hosts, seconds) for hosts in POOLS]
        report(runs, seconds)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each run")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of hosts=1, 2, 4")
    arguments = parser.parse_args()
    trio.run(main, arguments.seconds, arguments.rounds)
