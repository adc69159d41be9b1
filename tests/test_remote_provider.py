"""`codemode.open_remote_provider`: placement over listening hosts, unreachable hosts skipped,
admission refusals retried elsewhere, and recovery from a lost host with the reference's
"replaced" error. Hosts are real processes (`tests/remote_hosts.py`) on loopback or Unix
sockets."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import trio

import codemode
from codemode import (
    AdmissionError,
    Completed,
    HostLostError,
    RuntimeReplacedError,
    StaleGenerationError,
    WaitRequest,
)
from codemode.errors import RUNTIME_REPLACED
from tests.delegates import RecordingDelegate
from tests.remote_hosts import listening_host
from tests.sessions import execute, run, texts, tool

REPLACED = (
    "The exec runtime was replaced. Stored values and running cells were lost. Prior external"
    " tool operations may have completed; inspect their results before retrying. You may"
    " continue with a fresh exec call."
)


def _alive(session: codemode.Session) -> bool:
    return session.is_alive  # a call: mypy keeps no narrowing of the property across awaits


def test_the_replaced_text_is_the_references() -> None:
    assert RUNTIME_REPLACED == REPLACED
    assert str(RuntimeReplacedError()) == REPLACED
    assert issubclass(RuntimeReplacedError, HostLostError)


async def test_addresses_are_checked_on_entry() -> None:
    with pytest.raises(ValueError, match="at least one"):
        async with codemode.open_remote_provider([]):
            pass  # pragma: no cover
    with pytest.raises(ValueError, match="tcp://HOST:PORT or unix:PATH"):
        async with codemode.open_remote_provider(["localhost:1"]):
            pass  # pragma: no cover


@pytest.mark.slow
async def test_sessions_go_to_the_least_loaded_host(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with (
            listening_host() as tcp,
            listening_host(listen=f"unix:{tmp_path / 'b.sock'}") as unix,
            codemode.open_remote_provider([tcp.address, unix.address]) as provider,
        ):
            sessions = [await provider.create_session() for _ in range(4)]
            assert provider.placement() == {tcp.address: 2, unix.address: 2}
            # Ties go in the order of the addresses: 1st, 3rd to tcp; 2nd, 4th to unix.
            for index, session in enumerate(sessions):
                response = await run(session, RecordingDelegate(), f"text({index})")
                assert texts(response) == [str(index)]
            await sessions[2].shutdown()
            assert provider.placement() == {tcp.address: 1, unix.address: 2}
            await provider.create_session()
            assert provider.placement() == {tcp.address: 2, unix.address: 2}
            # Sessions created at once spread too: each counts where it is being opened.
            async with trio.open_nursery() as nursery:
                for _ in range(4):
                    nursery.start_soon(provider.create_session)
            assert provider.placement() == {tcp.address: 4, unix.address: 4}


@pytest.mark.slow
async def test_unreachable_hosts_are_skipped(tmp_path: Path) -> None:
    nowhere = f"unix:{tmp_path / 'nobody.sock'}"
    with trio.fail_after(60):
        async with (
            listening_host() as host,
            codemode.open_remote_provider([nowhere, host.address]) as provider,
        ):
            first = await provider.create_session()
            await provider.create_session()
            assert provider.placement() == {nowhere: 0, host.address: 2}
            assert texts(await run(first, RecordingDelegate(), "text('up')")) == ["up"]
        async with codemode.open_remote_provider([nowhere]) as provider:
            with pytest.raises(HostLostError) as caught:
                await provider.create_session()
            assert str(caught.value).startswith(
                f"no code-mode host could open the session: failed to connect to code-mode host"
                f" {nowhere}: "
            )


@pytest.mark.slow
async def test_an_admission_refusal_is_retried_on_another_host() -> None:
    with trio.fail_after(60):
        async with (
            listening_host("--max-requests-in-flight", "1") as narrow,
            listening_host() as wide,
            codemode.open_remote_provider([narrow.address, wide.address]) as provider,
        ):
            held = await provider.create_session()
            await provider.create_session()
            assert provider.placement() == {narrow.address: 1, wide.address: 1}
            # An execute is in flight until its initial response: the narrow host's one slot.
            delegate = RecordingDelegate()
            delegate.hold_tools = True
            started = await execute(held, delegate, "await tools.t({}); text('done')",
                                    tools=[tool("t")])  # fmt: skip
            await delegate.until(lambda: len(delegate.invocations) == 1)
            # The narrow host comes first (a tie, and first in order), refuses, and the
            # session opens on the wide one; nothing else is retried.
            await provider.create_session()
            assert provider.placement() == {narrow.address: 1, wide.address: 2}
            delegate.release.set()
            response = await started.initial_response()
            assert isinstance(response, Completed)
            assert texts(response) == ["done"]
        async with (
            listening_host("--max-requests-in-flight", "1") as only,
            codemode.open_remote_provider([only.address]) as provider,
        ):
            held = await provider.create_session()
            delegate = RecordingDelegate()
            delegate.hold_tools = True
            started = await execute(held, delegate, "await tools.t({})", tools=[tool("t")])
            await delegate.until(lambda: len(delegate.invocations) == 1)
            with pytest.raises(AdmissionError, match="too many in-flight requests"):
                await provider.create_session()
            delegate.release.set()
            assert isinstance(await started.initial_response(), Completed)


@pytest.mark.slow
async def test_a_lost_host_is_reported_once_as_replaced_then_the_session_goes_on() -> None:
    with trio.fail_after(90):
        async with (
            listening_host() as first,
            codemode.open_remote_provider([first.address]) as provider,
        ):
            session = await provider.create_session()
            delegate = RecordingDelegate()
            assert texts(await run(session, delegate, 'store("k", 1); text("kept")')) == ["kept"]
            started = await execute(session, delegate, "await new Promise(() => {})",
                                    yield_time_ms=0)  # fmt: skip
            assert started.cell_id == "2"
            await started.initial_response()

            async def wait_through_the_loss() -> None:
                # The link tries to resume; nothing listens where the host was: it is gone,
                # and the wait in flight says the runtime was replaced (docs/durability.md).
                with pytest.raises(RuntimeReplacedError) as caught:
                    await session.wait(WaitRequest(cell_id="2", yield_time_ms=60_000))
                assert str(caught.value) == REPLACED

            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait_through_the_loss)
                await trio.testing.wait_all_tasks_blocked()
                await first.stop(signal.SIGKILL)
            await delegate.until(lambda: "2" in delegate.closed)
            assert not _alive(session)

            # No host to reopen on: the operation fails as a lost host.
            with pytest.raises(HostLostError) as unreachable:
                await run(session, delegate, "text('nowhere')")
            assert not isinstance(unreachable.value, RuntimeReplacedError)
            assert "no code-mode host could open the session" in str(unreachable.value)
            assert not _alive(session)

            async with listening_host(listen=first.address) as second:
                # The replacement was said once already (by the wait): the reopening is silent.
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(session.cells)
                    nursery.start_soon(session.cells)
                assert _alive(session)

                # Then the session runs on the new host: next generation, values gone.
                response = await run(session, delegate, 'text(String(load("k")))')
                assert response.cell_id == "g2:1"
                assert texts(response) == ["undefined"]
                with pytest.raises(StaleGenerationError):
                    await session.wait(WaitRequest(cell_id="2"))
                assert provider.placement() == {second.address: 1}
                assert await second.stop() == 0


@pytest.mark.slow
async def test_a_host_that_stops_cleanly_is_replaced_too() -> None:
    with trio.fail_after(90):
        async with listening_host() as first:
            address = first.address
            async with codemode.open_remote_provider([address]) as provider:
                session = await provider.create_session()
                assert texts(await run(session, RecordingDelegate(), "text(1)")) == ["1"]
                assert await first.stop() == 0
                async with listening_host(listen=address):
                    # The host said goodbye (no resume): every operation waiting for the
                    # reopening fails with the same text, once.
                    failures: list[BaseException] = []

                    async def cells() -> None:
                        try:
                            await session.cells()
                        except RuntimeReplacedError as error:
                            failures.append(error)

                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(cells)
                        nursery.start_soon(cells)
                    assert [str(error) for error in failures] == [REPLACED, REPLACED]
                    response = await run(session, RecordingDelegate(), "text(3)")
                    assert (response.cell_id, texts(response)) == ("g2:1", ["3"])


@pytest.mark.slow
async def test_a_resolve_hook_finds_a_host_that_moved() -> None:
    asked: list[int] = []
    current: list[str] = []

    async def resolve(index: int) -> str:
        asked.append(index)
        if not current:
            raise HostLostError("not back yet")
        return current[0]

    with trio.fail_after(90):
        async with (
            listening_host() as first,
            codemode.open_remote_provider([first.address], resolve=resolve) as provider,
        ):
            session = await provider.create_session()
            assert texts(await run(session, RecordingDelegate(), "text(1)")) == ["1"]
            assert asked == []  # the first connection uses the address given
            assert await first.stop() == 0
            with pytest.raises(HostLostError, match=r"cannot resolve .* not back yet"):
                await run(session, RecordingDelegate(), "text(2)")
            async with listening_host() as moved:  # another port
                current.append(moved.address)
                with pytest.raises(RuntimeReplacedError):
                    await run(session, RecordingDelegate(), "text(3)")
                response = await run(session, RecordingDelegate(), "text(4)")
                assert (response.cell_id, texts(response)) == ("g2:1", ["4"])
                assert asked == [0, 0]
                assert provider.placement() == {moved.address: 1}
