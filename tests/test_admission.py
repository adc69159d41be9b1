"""Admission and capacity (issue 9): the bounds and their exact texts on both providers, the
cell inventory (`Session.cells()`), the host's options, its handshake and its SIGUSR1 log.

The cells run on the engine's worker threads, so waiting for a cell to reach a phase nobody
observes polls `cells()` (design.md, style 16: a poll where a thread is involved); everything else waits
on events.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import msgspec
import pytest
import trio
from codemode_host._options import add_admission_options, admission_from, parse_admission
from codemode_host.runtime import worker_ceiling

import codemode
from codemode import (
    AdmissionError,
    AdmissionLimits,
    CellInfo,
    Completed,
    LiveCell,
    Session,
    Terminated,
    WaitRequest,
    Yielded,
)
from codemode.protocol import (
    INVENTORY_CAPABILITY,
    Answered,
    CellList,
    Err,
    ErrorKind,
    Execute,
    ExecutionStarted,
    Hello,
    Ok,
    OpenSession,
    OperationRequest,
    OperationResponse,
    Ready,
    RequestReceived,
    SessionReady,
)
from tests.conftest import Provider
from tests.delegates import RecordingDelegate
from tests.protocol_pair import Pair
from tests.sessions import LONG_MS, execute, run, texts, tool
from tests.test_host import RawClient, handshake
from tests.test_seed_stdio import host_proxy

KINDS = ["in-process", pytest.param("process", marks=pytest.mark.slow)]
SPIN = "while (true) {}"


def host_options(limits: AdmissionLimits) -> list[str]:
    """`codemode-host` options that set `limits`."""
    names = limits.__struct_fields__
    return [f"--{name.replace('_', '-')}={getattr(limits, name)}" for name in names]


@asynccontextmanager
async def open_provider(kind: str, limits: AdmissionLimits) -> AsyncIterator[Provider]:
    if kind == "in-process":
        async with codemode.open_in_process_provider(admission=limits) as in_process:
            yield in_process
    else:
        command = [*codemode.default_host_command(), *host_options(limits)]
        async with codemode.open_process_provider(host_command=command) as process:
            yield process


async def until_cells(session: Session, holds: Callable[[list[CellInfo]], bool]) -> list[CellInfo]:
    """Poll the inventory until `holds` is true of it (the cells run on worker threads)."""
    while not holds(cells := await session.cells()):  # noqa: ASYNC110
        await trio.sleep(0.005)
    return cells


def all_completed(count: int) -> Callable[[list[CellInfo]], bool]:
    return lambda cells: [c.phase for c in cells] == ["completed"] * count


# ---- active cells ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_the_active_cell_cap_refuses_with_its_text_and_serves_on(kind: str) -> None:
    delegate = RecordingDelegate()
    with trio.fail_after(30):
        async with open_provider(kind, AdmissionLimits(max_active_cells=2)) as provider:
            first = await provider.create_session()
            other = await provider.create_session()
            spinners = [await execute(first, delegate, SPIN) for _ in range(2)]
            for spinner in spinners:
                spinner.release()
            for session in (first, other):  # the cap is the connection's, every session's
                with pytest.raises(AdmissionError) as refused:
                    await execute(session, delegate, "text('never')")
                assert str(refused.value) == "code-mode host has too many active cells"
            outcome = await first.terminate(spinners[0].cell_id)
            assert isinstance(outcome.response, Terminated)
            # The freed slot admits the next cell, and the refusals left nothing behind.
            assert texts(await run(other, delegate, "text('served')")) == ["served"]
            assert texts(await run(first, delegate, "text('again')")) == ["again"]
            await first.shutdown()
            await other.shutdown()


async def test_spinning_cells_up_to_the_cap_leave_a_worker_for_another_session() -> None:
    limits = AdmissionLimits(max_active_cells=4)
    delegate = RecordingDelegate()
    with trio.fail_after(30):
        async with codemode.open_in_process_provider(admission=limits) as provider:
            spinning = await provider.create_session()
            other = await provider.create_session()
            cells = []
            for _ in range(3):
                started = await execute(spinning, delegate, SPIN, yield_time_ms=0)
                assert isinstance(await started.initial_response(), Yielded)  # it runs
                cells.append(started.cell_id)
            with trio.fail_after(10):
                assert texts(await run(other, delegate, "text('trivial')")) == ["trivial"]
            started = await execute(spinning, delegate, SPIN, yield_time_ms=0)
            assert isinstance(await started.initial_response(), Yielded)
            cells.append(started.cell_id)
            for session in (spinning, other):
                with pytest.raises(
                    AdmissionError, match=r"^code-mode host has too many active cells$"
                ):
                    await execute(session, delegate, "text('fifth')")
            for cell_id in cells:
                outcome = await spinning.terminate(cell_id)
                assert isinstance(outcome.response, Terminated)
            await spinning.shutdown()
            await other.shutdown()


def test_the_engine_may_grow_to_at_least_the_active_cell_cap() -> None:
    assert worker_ceiling(AdmissionLimits(max_active_cells=200)) == 200
    assert worker_ceiling(AdmissionLimits(max_active_cells=4)) >= 4
    assert worker_ceiling(AdmissionLimits()) >= AdmissionLimits().max_active_cells


# ---- uncollected results -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_uncollected_results_hold_no_slot_and_are_bounded_per_session(kind: str) -> None:
    limits = AdmissionLimits(max_active_cells=2, max_uncollected_results=3)
    delegate = RecordingDelegate()
    with trio.fail_after(30):
        async with open_provider(kind, limits) as provider:
            session = await provider.create_session()
            other = await provider.create_session()
            cells = []
            for n in range(3):
                # A 0 ms window yields at the cell's start: the completion stays uncollected.
                started = await execute(session, delegate, f"text('result {n}')", yield_time_ms=0)
                assert isinstance(await started.initial_response(), Yielded)
                cells.append(started.cell_id)
                # Each completes before the next starts: none holds an active slot then.
                listed = await until_cells(session, all_completed(len(cells)))
            assert [c.cell_id for c in listed] == cells
            # Three results wait, more than the two active-cell slots: they hold none.
            assert texts(await run(other, delegate, "text('other')")) == ["other"]
            with pytest.raises(AdmissionError) as refused:
                await execute(session, delegate, "text('one too many')")
            assert str(refused.value) == (
                "code-mode session has 3 completed cells whose results were not collected:"
                " wait for or terminate them first"
            )
            outcome = await session.wait(WaitRequest(cell_id=cells[0], yield_time_ms=LONG_MS))
            assert isinstance(outcome.response, Completed)
            assert texts(outcome) == ["result 0"]
            assert texts(await run(session, delegate, "text('admitted')")) == ["admitted"]
            # Nothing was dropped: the others are still there to collect.
            outcome = await session.terminate(cells[1])
            assert isinstance(outcome.response, Completed)
            assert texts(outcome) == ["result 1"]
            # The count follows each collection exactly: one result waits, two more fit.
            for n in (3, 4):
                started = await execute(session, delegate, f"text('result {n}')", yield_time_ms=0)
                assert isinstance(await started.initial_response(), Yielded)
                cells.append(started.cell_id)
                await until_cells(session, all_completed(3 if n == 4 else 2))
            with pytest.raises(AdmissionError):
                await execute(session, delegate, "text('one too many again')")
            for n in (2, 3, 4):
                outcome = await session.wait(WaitRequest(cell_id=cells[n], yield_time_ms=LONG_MS))
                assert texts(outcome) == [f"result {n}"]
            assert await session.cells() == []
            await session.shutdown()
            await other.shutdown()


# ---- pending delegate calls and the inventory ---------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_a_call_past_the_pending_call_bound_is_rejected_and_the_inventory_shows_it(
    kind: str,
) -> None:
    delegate = RecordingDelegate()
    delegate.hold_tools = True
    source = """
const held = [tools.hold({}), tools.hold({})];
try { await tools.hold({}); } catch (e) { text(String(e)); }
await Promise.all(held);
text("released");
"""
    limits = AdmissionLimits(max_pending_delegate_calls=2)
    with trio.fail_after(30):
        async with open_provider(kind, limits) as provider:
            session = await provider.create_session()
            started = await execute(session, delegate, source, tools=[tool("hold")])
            await delegate.until(lambda: len(delegate.invocations) == 2)
            [info] = await until_cells(session, lambda c: c[0].buffered_output_bytes > 0)
            assert info.cell_id == started.cell_id
            assert info.phase == "running"
            assert info.pending_tool_calls == 2
            assert info.buffered_output_bytes > len("code-mode host has too many pending")
            assert info.age_s >= 0
            assert info.cpu_time_ms >= 0
            delegate.release.set()
            response = await started.initial_response()
            assert isinstance(response, Completed)
            assert texts(response) == [
                "code-mode host has too many pending delegate calls",
                "released",
            ]
            assert len(delegate.invocations) == 2  # the refused call never reached the delegate
            # The slots came back: the same calls fit again.
            response = await run(session, delegate, source, tools=[tool("hold")])
            assert texts(response)[-1] == "released"
            await session.shutdown()
            with pytest.raises(codemode.SessionShuttingDownError):
                await session.cells()


@pytest.mark.parametrize("kind", KINDS)
async def test_the_inventory_names_each_phase(kind: str) -> None:
    delegate = RecordingDelegate()
    with trio.fail_after(30):
        async with open_provider(kind, AdmissionLimits()) as provider:
            session = await provider.create_session()
            done = await execute(session, delegate, "text('done')", yield_time_ms=0)
            await done.initial_response()
            spinner = await execute(session, delegate, SPIN)
            spinner.release()
            listed = await until_cells(session, lambda c: c[0].phase == "completed")
            assert [(c.cell_id, c.phase) for c in listed] == [
                (done.cell_id, "completed"),
                (spinner.cell_id, "running"),
            ]
            assert all(c.age_s >= 0 and c.pending_tool_calls == 0 for c in listed)
            outcome = await session.terminate(spinner.cell_id)
            assert isinstance(outcome, LiveCell)
            assert [c.cell_id for c in await session.cells()] == [done.cell_id]
            await session.shutdown()


@pytest.mark.slow
async def test_the_inventory_of_a_new_host_generation_has_public_ids(tmp_path: Path) -> None:
    proxy, pid_path = host_proxy(tmp_path)
    delegate = RecordingDelegate()
    async with codemode.open_process_provider([str(proxy)]) as provider:
        session = await provider.create_session()
        with trio.fail_after(20):
            await run(session, delegate, "1")
            old_pid = int(pid_path.read_text())
            os.kill(old_pid, signal.SIGKILL)
            # The first operations may still see the dead host; one of them spawns the next.
            while int(pid_path.read_text()) == old_pid:
                with contextlib.suppress(codemode.CodeModeError):
                    await run(session, delegate, "1")
            spinner = await execute(session, delegate, SPIN)
            spinner.release()
            assert spinner.cell_id.startswith("g2:")
            assert [c.cell_id for c in await session.cells()] == [spinner.cell_id]
            await session.terminate(spinner.cell_id)
            await session.shutdown()


# ---- requests in flight (the sans-IO host connection) -------------------------------------------


def test_requests_past_the_in_flight_bound_are_refused_at_once() -> None:
    limits = AdmissionLimits(max_requests_in_flight=2)
    pair = Pair(capabilities=(INVENTORY_CAPABILITY,), admission=limits)
    pair.handshake()
    assert pair.client.admission == limits
    pair.client.open_session("s", None)
    [opened] = pair.to_host()
    assert isinstance(opened, RequestReceived)
    pair.host.respond(opened.request_id, Ok(value=SessionReady(session_id="s")))
    pair.to_client()
    asked = [pair.client.cells("s") for _ in range(3)]
    received = pair.to_host()
    assert [e.request_id for e in received if isinstance(e, RequestReceived)] == asked[:2]
    refusal = Err(
        kind=ErrorKind.ADMISSION, message="code-mode host has too many in-flight requests"
    )
    assert pair.to_client() == [Answered(request_id=asked[2], result=refusal)]
    # An answer frees a slot; the connection serves on.
    pair.host.respond(asked[0], Ok(value=CellList(cells=[])))
    assert pair.to_client() == [Answered(request_id=asked[0], result=Ok(value=CellList(cells=[])))]
    again = pair.client.cells("s")
    assert [e.request_id for e in pair.to_host() if isinstance(e, RequestReceived)] == [again]


def test_the_limits_are_encoded_in_the_handshake_only_when_present() -> None:
    encode = msgspec.msgpack.encode
    plain = msgspec.msgpack.decode(encode(Ready(selected_version=1, capabilities=[])))
    assert "admission" not in plain
    advertised = Ready(selected_version=1, capabilities=[], admission=AdmissionLimits())
    assert msgspec.msgpack.decode(encode(advertised))["admission"]["max_active_cells"] == 128
    pair = Pair()
    pair.handshake()
    assert pair.client.admission == AdmissionLimits()


# ---- the host program --------------------------------------------------------------------------


def test_the_admission_options_parse_into_limits() -> None:
    parser = argparse.ArgumentParser()
    add_admission_options(parser)
    assert admission_from(parser.parse_args([])) == AdmissionLimits()
    options = parser.parse_args(["--max-active-cells", "3", "--max-uncollected-results=5"])
    assert admission_from(options) == AdmissionLimits(max_active_cells=3, max_uncollected_results=5)
    assert parse_admission(["--max-requests-in-flight=9"]).max_requests_in_flight == 9


@pytest.mark.slow
async def test_a_bad_admission_option_is_one_line_and_status_2() -> None:
    command = [*codemode.default_host_command(), "--max-active-cells", "0"]
    with trio.fail_after(20):
        done = await trio.run_process(command, capture_stderr=True, check=False)
    assert done.returncode == 2
    assert done.stderr.decode().splitlines()[-1] == (
        "codemode-host: error: argument --max-active-cells: expected a positive integer,"
        " got '0' (see codemode-host --help)"
    )


async def _read_stderr_until(process: trio.Process, marker: bytes) -> bytes:
    assert process.stderr is not None
    seen = b""
    while marker not in seen:
        chunk = await process.stderr.receive_some(65536)
        assert chunk, f"the host closed its stderr before {marker!r}: {seen!r}"
        seen += chunk
    return seen


@pytest.mark.slow
async def test_the_host_advertises_its_options_and_logs_its_inventory_on_sigusr1() -> None:
    limits = AdmissionLimits(max_active_cells=3, max_pending_delegate_calls=7)
    command = [*codemode.default_host_command(), *host_options(limits)]
    process = await trio.lowlevel.open_process(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    client = RawClient(process)
    try:
        with trio.fail_after(20):
            hello = Hello(supported_versions=[1], optional_capabilities=[INVENTORY_CAPABILITY])
            ready = await handshake(client, hello)
            assert ready.admission == limits
            assert ready.capabilities == [INVENTORY_CAPABILITY]
            await client.request(1, OpenSession(session_id="s"))
            request = codemode.ExecuteRequest(tool_call_id="c", source=SPIN, yield_time_ms=LONG_MS)
            await client.send(
                OperationRequest(id=2, request=Execute(session_id="s", request=request))
            )
            started = await client.receive()
            assert started == OperationResponse(
                id=2, result=Ok(value=ExecutionStarted(cell_id="1"))
            )
            process.send_signal(signal.SIGUSR1)
            log = (await _read_stderr_until(process, b"cpu_time_ms=")).decode()
            assert (
                "inventory: 1 sessions; active cells 1/3; pending delegate calls 0/7;"
                " requests in flight 1/256"
            ) in log
            assert "  session s: 1 cells\n    cell 1: phase='running' age_s=" in log
            await client.close_stdin()
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
        with trio.CancelScope(shield=True):
            await process.wait()
