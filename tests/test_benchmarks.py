"""The benchmark table still runs and writes its JSON (benchmarks/table.py), so the instrument
does not rot between the runs that matter. Smoke mode: two or three repetitions of a subset of
the scripts; no timing is asserted, only the shape of what is written and that its figures
hold together (durations and rates above zero, each p99 at or above its median, the ratios).
The instruction counter (benchmarks/instructions.py) is checked without valgrind: how it reads
callgrind's files, and that the workloads it counts run and print what they should."""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
import trio

from benchmarks import (
    chart,
    engine_bench,
    instructions,
    listener_bench,
    paired_cpu,
    table,
    timeline,
)
from benchmarks._measure import SCHEMA, Config, read_json, render, write_json
from codemode import InputText
from tests.typecheck import ROOT

# The faster scripts; startup and payload spawn a host several times and move 16 MiB, and only
# their imports are checked here (table imports every script).
SUBSET = ["latency", "terminate", "throughput", "memory", "engine"]


@pytest.mark.slow
async def test_the_table_runs_in_smoke_mode_and_writes_its_schema(tmp_path: Path) -> None:
    with trio.fail_after(120):
        written = await table.measure(Config(mode="smoke"), SUBSET)
    path = tmp_path / "results" / "table.json"
    write_json(written, path)
    loaded = read_json(path)

    assert loaded.schema == SCHEMA
    assert loaded.mode == "smoke"
    assert loaded.machine.cpus >= 1
    assert {figure.item for figure in loaded.figures} == {1, 2, 3, 4, 5, 6, 7}
    keys = [figure.key for figure in loaded.figures]
    assert len(keys) == len(set(keys))
    for key in ("execute/process", "tool/process", "throughput/64/process", "engine/fib"):
        assert key in keys
    for key in ("execute/thin-host", "tool/thin-host", "throughput/64/thin-host"):
        assert key in keys
    for figure in loaded.figures:
        assert figure.value.n >= 1
        assert figure.value.p99 >= figure.value.median, figure.key
        if figure.unit in {"ms", "us", "cells/s"}:
            # A duration or a rate read as zero or less is a misread clock or counter; memory
            # figures are differences of RSS, which may be anything in a smoke run.
            assert figure.value.median > 0, figure.key
        if figure.floor is not None and figure.floor.median > 0:
            assert figure.ratio is not None
            assert figure.ratio == pytest.approx(figure.value.median / figure.floor.median)
    assert "execute -> Completed" in render(loaded.figures)

    svg = chart.svg(loaded)
    assert ElementTree.fromstring(svg).tag.endswith("svg")


@pytest.mark.slow
async def test_the_listener_benchmark_runs_in_smoke_mode() -> None:
    # A host, client processes and silent connections: the figures are there and hold together;
    # none is asserted beyond that (a smoke run is too short to say anything of the host).
    size = listener_bench.SMOKE
    with trio.fail_after(120):
        figures = await listener_bench.measure(size)
    assert figures["cells"]["total"] > 0
    assert figures["cells"]["errors"] == 0, figures["cells"]["first_error"]
    client = figures["per_client"]
    assert 0 <= client["min"] <= client["median"] <= client["max"]
    assert figures["silent"]["opened"] >= size.silent
    host = figures["host"]
    assert host["fds"]["peak"] >= host["fds"]["baseline"] + size.silent
    assert host["rss_mib"]["peak"] > 0
    assert figures["latency_ms"]["p99"] >= figures["latency_ms"]["p50"] > 0
    assert "cells per client" in listener_bench.render(figures)


def test_nox_installs_the_wheel_the_engine_benchmark_names() -> None:
    assert f'"{engine_bench.WHEEL}"' in (ROOT / "noxfile.py").read_text()


def test_the_instruction_counts_are_read_per_thread(tmp_path: Path) -> None:
    def write(name: str, total: int) -> None:
        header = "version: 1\ncreator: callgrind-3.19.0\npid: 7\nthread: 1\nevents: Ir\n"
        (tmp_path / name).write_text(f"{header}summary: {total}\n\nfn=main\n1 {total}\n")

    write("host-text-long.7-01", 5_000)
    write("host-text-long.7-02", 300)
    write("host-text-long.7-03", 40)
    assert instructions.thread_counts(tmp_path / "host-text-long") == (5_000, 340)

    write("host-text-short.8-01", 1_000)
    write("host-text-short.9-01", 1_000)
    with pytest.raises(ValueError, match="more than one process"):
        instructions.thread_counts(tmp_path / "host-text-short")
    with pytest.raises(FileNotFoundError):
        instructions.thread_counts(tmp_path / "client-text-long")


@pytest.mark.parametrize(
    "component", [pytest.param("client", marks=pytest.mark.slow), "in-process"]
)
async def test_the_counted_workloads_run(component: str) -> None:
    # What runs under valgrind, run here without it: the cells complete with their output.
    printed = {"text": "hi", "tool": "ok"}
    assert set(printed) == set(instructions.WORKLOADS)
    with trio.fail_after(30):
        for workload, text in printed.items():
            outputs = await instructions.run_cells(component, workload, 2)
            assert outputs == [[InputText(text=text)]] * 2, workload


async def test_the_counted_workloads_run_through_the_thin_host() -> None:
    # The thin host's rows: the same workloads, their texts as the thin host returns them.
    printed = {"text": "hi", "tool": "ok"}
    with trio.fail_after(30):
        for workload, text in printed.items():
            outputs = await instructions.run_cells("thin-client", workload, 2)
            assert outputs == [[text]] * 2, workload


@pytest.mark.parametrize(
    "component", [pytest.param("client", marks=pytest.mark.slow), "in-process", "thin-client"]
)
async def test_the_counted_workloads_run_in_sessions_at_once(component: str) -> None:
    # `--sessions`: the cells asked for, no more, shared among the sessions.
    expected = [InputText(text="ok")] if component != "thin-client" else ["ok"]
    with trio.fail_after(30):
        outputs = await instructions.run_cells(component, "tool", 7, sessions=3)
    assert outputs == [expected] * 7


@pytest.mark.slow
async def test_the_timeline_probes_both_hosts() -> None:
    # The probes patch the engine's start_cell and _dispatch: a rename must fail here.
    with trio.fail_after(60):
        timelines = await timeline.measure(20)
    for name, found in timelines.items():
        labels = [step.label for step in found.steps]
        assert (labels[0], labels[-1]) == ("C01", "C51"), name
        assert {"W1", "r1", "s01", "s11", "d1", "w1", "R1"} <= set(labels), name
        assert 1 <= found.usual <= found.cells == 20
        ats = [step.at for step in found.steps]
        assert ats == sorted(ats)
    assert "C31" in [step.label for step in timelines["process provider"].steps]


@pytest.mark.parametrize("mode", instructions.TRACING_MODES)
async def test_each_tracing_mode_of_the_instruction_counter_runs(mode: str) -> None:
    from codemode import observability

    previous = observability.current_settings()
    try:
        instructions.configure_tracing(mode)
        with trio.fail_after(30):
            outputs = await instructions.run_cells("in-process", "tool", 2)
        assert len(outputs) == 2
        assert (observability.lookup() is None) == (mode == "off")
    finally:
        observability.restore(previous)


def test_the_instruction_table_shows_each_mode_against_off() -> None:
    rows = [
        ("client", "text", "off", [100.0, 110.0], [1.0]),
        ("client", "text", "memory", [150.0], [2.0]),
    ]
    lines = instructions.render(rows).splitlines()
    assert lines[0].split()[-2:] == ["vs", "off"]
    assert lines[1].endswith("1.00x")
    assert lines[2].endswith("1.43x")


@pytest.mark.slow
async def test_the_paired_cpu_benchmark_alternates_and_renders_its_ratios() -> None:
    with trio.fail_after(60):
        measured = await paired_cpu.measure(pairs=2, window=0.2, sessions=4)
    assert len(measured) == 2
    for process, thin in measured:
        assert process.total > 0
        assert thin.total > 0
        assert process.rate > 0
        assert thin.rate > 0
        assert set(process.parts) == set(thin.parts) == set(paired_cpu.COMPONENTS)
        # The components are parts of the total (the rest: other and exited threads).
        assert sum(process.parts.values()) <= process.total * 1.0001
    lines = paired_cpu.render(measured).splitlines()
    assert len(lines) == 4
    assert lines[-1].startswith("median ratio ")
    assert " cells a second " in lines[-1]
    assert f"{measured[0][0].rate:>5.0f}/" in lines[1]
    ratio = measured[0][0].total / measured[0][1].total
    assert f"{ratio:.3f}x" in lines[1]
