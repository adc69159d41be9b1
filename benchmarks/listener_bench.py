"""The listener under load: many clients running cells through one listening host beside a
crowd of silent connections, and whether the host gives its memory and descriptors back.

A `codemode-host --listen` process (`_listener_host.py`) is started with its connection bounds
raised above the silent connections and the clients (the hello deadline is the host's
default, 10 s, unless `--hello-timeout`). Then, in order:

1. warm-up: one client runs a few cells and leaves (what the first cells load once is in the
   baseline); the host's RSS and open descriptors are then the *baseline*;
2. `--silent` TCP connections are opened (at most 64 connecting at once: the listen backlog is
   128) that never send a hello; the host closes each at its hello deadline and each is
   opened again at once, so that about `--silent` are present for the whole run; each close
   is an *eviction*, counted here and by reason in the host's log;
3. `--clients` clients, spread over `--client-processes` processes (this script run with
   `--client-worker`), each its own `open_remote_provider` connection with `--sessions`
   sessions, connect beside the silent ones; once all are in, every session runs cells in a
   closed loop for `--duration` seconds: `await tools.echo({})` then a short text, the next
   cell as soon as one completes (`--pause` seconds between them to slow the loop);
4. the clients leave and the silent connections are closed; the host's descriptor count is
   polled (bounded) until it is back to the baseline, then its RSS until it stops falling.

With `--rounds N`, steps 2-4 run N times against the same host: RSS after each round tells
memory the host keeps for reuse (flat from the second round) from a leak (growing); the
figures are the last round's, the peaks over all rounds.

Printed (and written as JSON, `benchmarks/results/listener.json` unless `--json PATH`): cells
completed per client (min / median / max; a client with none is *starved*), per session the
least, the time each client took to connect and open its sessions, latency per cell (execute ->
initial response, p50 / p99), the host's RSS and descriptors at baseline, at peak (sampled
every 0.25 s) and after, the host's CPU time during the run, the silent connections' evictions,
and the clients' own CPU time (the clients share the machine with the host).

Run: `python -m benchmarks.listener_bench [--clients 200] [--sessions 4] [--silent 1000]
[--duration 60] [--client-processes 2] [--rounds 1] [--smoke]` (`--smoke`: 3 clients x 2
sessions, 10 silent connections, 2 s; what `tests/test_benchmarks.py` runs).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import trio

import codemode
from benchmarks._cells import Delegate, run_cell
from benchmarks._listener_host import (
    Host,
    Silent,
    Watch,
    back_to,
    listening_host,
    read_line,
    sample_peaks,
    settled_rss,
    silent_connection,
)
from benchmarks._measure import WorkloadError
from benchmarks._proc import CpuSample

CELL = "const r = await tools.echo({}); text('ok')"
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "listener.json"
CONNECTING_AT_ONCE = 64
CONNECT_BOUND = 120.0
"""Seconds every client has to connect and open its sessions."""


@dataclass(frozen=True)
class Size:
    clients: int = 200
    sessions: int = 4
    silent: int = 1000
    duration: float = 60.0
    client_processes: int = 2
    pause: float = 0.0
    rounds: int = 1
    hello_timeout: float | None = None

    def host_options(self) -> list[str]:
        waiting = self.silent + self.clients + 64
        options = [
            f"--max-waiting-connections={waiting}",
            f"--max-connections={max(1024, self.clients + 64)}",
        ]
        if self.hello_timeout is not None:
            options.append(f"--hello-timeout={self.hello_timeout:g}")
        return options


SMOKE = Size(clients=3, sessions=2, silent=10, duration=2.0, client_processes=1)


# -- the client side (`--client-worker`): one process running some of the clients --------------


@dataclass
class ClientResult:
    cells: int = 0
    per_session: list[int] = field(default_factory=list)
    errors: int = 0
    first_error: str | None = None
    connect_s: float = 0.0
    latencies: list[float] = field(default_factory=list)


async def _client(
    address: str,
    sessions: int,
    pause: float,
    result: ClientResult,
    ready: trio.Semaphore,
    go: trio.Event,
    stop_at: list[float],
) -> None:
    delegate = Delegate()
    started = time.perf_counter()
    async with codemode.open_remote_provider([address]) as provider:
        opened = [await provider.create_session() for _ in range(sessions)]
        result.connect_s = time.perf_counter() - started
        result.per_session = [0] * sessions
        ready.release()
        await go.wait()

        async def loop(index: int, session: codemode.Session) -> None:
            while time.perf_counter() < stop_at[0]:
                begun = time.perf_counter()
                try:
                    await run_cell(session, CELL, delegate, ["echo"])
                except (WorkloadError, codemode.CodeModeError) as error:
                    result.errors += 1
                    result.first_error = result.first_error or repr(error)
                    await trio.sleep(0.1)
                    continue
                result.latencies.append(time.perf_counter() - begun)
                result.cells += 1
                result.per_session[index] += 1
                if pause:
                    await trio.sleep(pause)

        async with trio.open_nursery() as nursery:
            for index, session in enumerate(opened):
                nursery.start_soon(loop, index, session)


async def client_worker(address: str, clients: int, sessions: int, pause: float) -> None:
    """Connect `clients` clients, print `ready`, wait for a line `go DURATION` on stdin, run
    the cells, print the results as one line of JSON."""
    results = [ClientResult() for _ in range(clients)]
    ready = trio.Semaphore(0)
    go = trio.Event()
    stop_at = [0.0]
    stdin = trio.lowlevel.FdStream(os.dup(0))
    cpu_before = time.process_time()
    async with trio.open_nursery() as nursery:
        for result in results:
            nursery.start_soon(_client, address, sessions, pause, result, ready, go, stop_at)
        for _ in range(clients):
            await ready.acquire()
        print("ready", flush=True)
        line = b""
        while not line.endswith(b"\n"):
            chunk = await stdin.receive_some(64)
            if not chunk:
                raise RuntimeError("stdin closed before `go`")
            line += chunk
        duration = float(line.split()[1])
        cpu_start = time.process_time()
        stop_at[0] = time.perf_counter() + duration
        go.set()
    # The providers are closed (their sessions shut down) when the nursery ends.
    cpu = {"run": time.process_time() - cpu_start, "all": time.process_time() - cpu_before}
    print(json.dumps({"clients": [asdict(result) for result in results], "cpu": cpu}), flush=True)


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if index < total % parts else 0) for index in range(parts)]


async def _client_processes(
    host: Host, size: Size
) -> tuple[list[dict[str, Any]], list[dict[str, float]], float]:
    """Run the clients; their results, each process's CPU, and the wall time of the run."""
    counts = [n for n in _split(size.clients, size.client_processes) if n]
    processes = []
    for count in counts:
        command = [
            sys.executable,
            "-m",
            "benchmarks.listener_bench",
            "--client-worker",
            host.address,
            f"--clients={count}",
            f"--sessions={size.sessions}",
            f"--pause={size.pause}",
        ]
        processes.append(
            await trio.lowlevel.open_process(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT
            )
        )
    buffers = [bytearray() for _ in processes]
    try:
        with trio.fail_after(CONNECT_BOUND):
            for process, buffer in zip(processes, buffers, strict=True):
                assert process.stdout is not None
                line = await read_line(process.stdout, buffer)
                if line != b"ready":
                    raise RuntimeError(f"a client process said {line!r}")
        started = time.perf_counter()
        for process in processes:
            assert process.stdin is not None
            await process.stdin.send_all(f"go {size.duration}\n".encode())
        outputs: list[dict[str, Any]] = []
        with trio.fail_after(size.duration + CONNECT_BOUND):
            for process, buffer in zip(processes, buffers, strict=True):
                assert process.stdout is not None
                outputs.append(json.loads(await read_line(process.stdout, buffer)))
            wall = time.perf_counter() - started
            for process in processes:
                await process.wait()
    finally:
        with trio.CancelScope(shield=True):
            for process in processes:
                if process.returncode is None:
                    process.kill()
                await process.wait()
    clients = [client for output in outputs for client in output["clients"]]
    return clients, [output["cpu"] for output in outputs], wall


def _percentile(ordered: Sequence[float], fraction: float) -> float:
    if not ordered:
        return 0.0
    return ordered[max(0, min(len(ordered) - 1, round(fraction * len(ordered)) - 1))]


async def measure(size: Size) -> dict[str, Any]:
    """One run at `size`; the figures (see the module's docstring)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if size.silent + 64 > hard:
        raise RuntimeError(f"{size.silent} silent connections need more descriptors than {hard}")
    async with listening_host(size.host_options()) as host:
        start_rss, start_fds = host.rss(), host.fds()
        async with codemode.open_remote_provider([host.address]) as provider:
            session = await provider.create_session()
            for _ in range(20):
                await run_cell(session, CELL, Delegate(), ["echo"])
        base_fds, _ = await back_to(host, start_fds)
        base_rss = await settled_rss(host)
        cpu_before = CpuSample(host.pid)

        watch = Watch()
        rounds: list[dict[str, float]] = []
        name, port = host.address.removeprefix("tcp://").rsplit(":", 1)
        for _ in range(size.rounds):
            tally = Silent()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(sample_peaks, host, watch)
                limiter = trio.CapacityLimiter(CONNECTING_AT_ONCE)
                for _ in range(size.silent):
                    nursery.start_soon(
                        silent_connection, name, int(port), tally, limiter, size.silent
                    )
                if size.silent:
                    with trio.fail_after(CONNECT_BOUND):
                        await tally.all_opened.wait()
                evicted_before = tally.evicted
                clients, client_cpu, wall = await _client_processes(host, size)
                evicted_during = tally.evicted - evicted_before
                present_at_end = tally.present
                nursery.cancel_scope.cancel()
            left_at = time.perf_counter()
            after_fds, returned_s = await back_to(host, base_fds)
            after_rss = await settled_rss(host)
            rounds.append(
                {
                    "cells": sum(client["cells"] for client in clients),
                    "rss_mib": after_rss / 2**20,
                    "fds": after_fds,
                    "settled_s": time.perf_counter() - left_at,
                }
            )
        cpu_after = CpuSample(host.pid)
        no_hello = host.log_count("no hello within")
        waiting_evictions = host.log_count("were waiting for their hello")
        too_many = host.log_count("clients are connected (--max-connections)")
        failed = host.log_count("failed")

    per_client = sorted(client["cells"] for client in clients)
    per_session = sorted(n for client in clients for n in client["per_session"])
    latencies = sorted(s for client in clients for s in client["latencies"])
    connects = sorted(client["connect_s"] for client in clients)
    errors = sum(client["errors"] for client in clients)
    first_errors = [client["first_error"] for client in clients if client["first_error"]]
    total = sum(per_client)
    return {
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count() or 0,
            "python": platform.python_version(),
            "load_average": list(os.getloadavg()),
        },
        "size": asdict(size),
        "host_options": size.host_options(),
        "cells": {
            "total": total,
            "per_second": total / wall if wall else 0.0,
            "wall_s": wall,
            "errors": errors,
            "first_error": first_errors[0] if first_errors else None,
        },
        "per_client": {
            "min": per_client[0],
            "median": statistics.median(per_client),
            "max": per_client[-1],
            "starved": sum(1 for n in per_client if n == 0),
        },
        "per_session": {
            "min": per_session[0],
            "median": statistics.median(per_session),
            "max": per_session[-1],
            "starved": sum(1 for n in per_session if n == 0),
        },
        "connect_s": {"median": statistics.median(connects), "max": connects[-1]},
        "latency_ms": {
            "p50": _percentile(latencies, 0.50) * 1e3,
            "p99": _percentile(latencies, 0.99) * 1e3,
            "max": (latencies[-1] if latencies else 0.0) * 1e3,
        },
        "host": {
            "rss_mib": {
                "start": start_rss / 2**20,
                "baseline": base_rss / 2**20,
                "peak": watch.rss / 2**20,
                "after": after_rss / 2**20,
            },
            "fds": {
                "start": start_fds,
                "baseline": base_fds,
                "peak": watch.fds,
                "after": after_fds,
            },
            "fds_returned_s": returned_s,
            "after_each_round": rounds,
            "cpu_s": (cpu_after.total - cpu_before.total) / 1e6,
            "samples": watch.samples,
        },
        "clients_cpu_s": {
            "run": sum(cpu["run"] for cpu in client_cpu),
            "all": sum(cpu["all"] for cpu in client_cpu),
        },
        "silent": {
            "opened": tally.opened,
            "evicted": tally.evicted,
            "evicted_during_run": evicted_during,
            "present_at_end": present_at_end,
            "connect_failures": tally.refused,
        },
        "host_log": {
            "no_hello": no_hello,
            "evicted_waiting": waiting_evictions,
            "refused_max_connections": too_many,
            "failed": failed,
        },
    }


def render(figures: dict[str, Any]) -> str:
    size, host = figures["size"], figures["host"]
    rss, fds = host["rss_mib"], host["fds"]
    client, session, latency = figures["per_client"], figures["per_session"], figures["latency_ms"]
    silent, log, cells = figures["silent"], figures["host_log"], figures["cells"]
    rows = [
        (
            "size",
            f"{size['clients']} clients x {size['sessions']} sessions, {size['silent']} silent,"
            f" {size['duration']:g} s, {size['client_processes']} client processes",
        ),
        (
            "cells",
            f"{cells['total']} ({cells['per_second']:.0f}/s over {cells['wall_s']:.1f} s),"
            f" {cells['errors']} errors",
        ),
        (
            "cells per client",
            f"min {client['min']}  median {client['median']:g}  max {client['max']}"
            f"  starved {client['starved']}",
        ),
        (
            "cells per session",
            f"min {session['min']}  median {session['median']:g}  max {session['max']}"
            f"  starved {session['starved']}",
        ),
        (
            "connect + sessions",
            f"median {figures['connect_s']['median'] * 1e3:.0f} ms"
            f"  max {figures['connect_s']['max'] * 1e3:.0f} ms",
        ),
        (
            "latency per cell",
            f"p50 {latency['p50']:.1f} ms  p99 {latency['p99']:.1f} ms"
            f"  max {latency['max']:.1f} ms",
        ),
        (
            "host RSS (MiB)",
            f"start {rss['start']:.1f}  baseline {rss['baseline']:.1f}  peak {rss['peak']:.1f}"
            f"  after {rss['after']:.1f}",
        ),
        (
            "host fds",
            f"start {fds['start']}  baseline {fds['baseline']}  peak {fds['peak']}"
            f"  after {fds['after']} (back in {host['fds_returned_s']:.1f} s)",
        ),
        (
            "CPU (s)",
            f"host {host['cpu_s']:.1f}  clients {figures['clients_cpu_s']['run']:.1f}"
            f" (during the cells)",
        ),
        (
            "silent connections",
            f"opened {silent['opened']}  evicted {silent['evicted']}"
            f" ({silent['evicted_during_run']} while the clients ran)"
            f"  present at the end {silent['present_at_end']}",
        ),
        (
            "host log",
            f"no hello {log['no_hello']}  evicted waiting {log['evicted_waiting']}"
            f"  refused (max connections) {log['refused_max_connections']}"
            f"  failed {log['failed']}",
        ),
    ]
    if len(host["after_each_round"]) > 1:
        after = "  ".join(
            f"{each['rss_mib']:.1f} MiB / {each['fds']} fds" for each in host["after_each_round"]
        )
        rows.append(("after each round", after))
    if cells["first_error"]:
        rows.append(("first error", cells["first_error"]))
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:>{width}}  {value}" for label, value in rows)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    default = Size()
    parser.add_argument("--clients", type=int, default=None)
    parser.add_argument("--sessions", type=int, default=None)
    parser.add_argument("--silent", type=int, default=None)
    parser.add_argument("--duration", type=float, default=None)
    parser.add_argument("--client-processes", type=int, default=None)
    parser.add_argument("--pause", type=float, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--hello-timeout", type=float, default=None)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--client-worker", metavar="ADDRESS", default=None, help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    base = SMOKE if arguments.smoke else default
    chosen = {
        name: getattr(arguments, name)
        for name in (
            "clients",
            "sessions",
            "silent",
            "duration",
            "client_processes",
            "pause",
            "rounds",
        )
        if getattr(arguments, name) is not None
    }
    if arguments.hello_timeout is not None:
        chosen["hello_timeout"] = arguments.hello_timeout
    size = Size(**{**asdict(base), **chosen})
    if arguments.client_worker is not None:
        trio.run(client_worker, arguments.client_worker, size.clients, size.sessions, size.pause)
        return
    figures = trio.run(measure, size)
    print(render(figures))
    arguments.json.parent.mkdir(parents=True, exist_ok=True)
    arguments.json.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"written: {arguments.json}")


if __name__ == "__main__":
    main()
