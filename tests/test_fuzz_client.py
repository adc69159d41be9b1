"""The process provider against a host that misbehaves: it exits before or during the
handshake, writes garbage, or breaks after a few good frames with a cell and a tool call in
flight.

Each case: a clear `HostLostError` (never a hang, never another exception), each live cell gets
exactly one `cell_closed`, and the next operation recovers on a fresh (real) host; the host
command's later starts exec the real host. The real processes are `tests/fake_host.py`'s
(slow); the fuzz of garbage handshakes runs against in-memory hosts (`tests/memory_host.py`)
on the mock clock, as do the timeouts (a handshake that stalls, a host that stalls mid-frame:
`tests/test_client_timeouts.py`). Every test is bounded by `trio.fail_after`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import codemode
from codemode import Completed, HostLostError, Session
from tests.delegates import RecordingDelegate
from tests.memory_host import memory_hosts, writes
from tests.sessions import execute, run, texts, tool

FAKE_HOST = Path(__file__).with_name("fake_host.py")
BOUND = 30.0
HANDSHAKE_TIMEOUT = 2.0
"""Seconds a host that stalls in the handshake is given (the provider's option)."""

REASONS = (
    "failed to read code-mode host message",
    "timed out negotiating with the code-mode host",
    "code-mode host rejected the handshake",
    "code-mode host closed its stdout",
    "code-mode host exited during handshake",
)
"""How a handshake answered with garbage may fail: the start of the `HostLostError` text."""
FIGURES: dict[str, int] = {"garbage examples": 0}
"""What the garbage fuzz did: its examples, and how many failed with each of `REASONS`."""


def fake_command(tmp: Path, mode: str, argument: str) -> list[str]:
    counter = tmp / f"starts-{mode}-{argument[:16]}"
    counter.unlink(missing_ok=True)
    return [sys.executable, str(FAKE_HOST), mode, argument, str(counter),
            *codemode.default_host_command()]  # fmt: skip


async def _recovers(session: Session) -> None:
    response = await run(session, RecordingDelegate(), "text('recovered')")
    assert isinstance(response, Completed), response
    assert texts(response) == ["recovered"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "argument", "reason"),
    [
        ("exit", "3", "code-mode host exited during handshake with status 3"),
        ("exit-at-hello", "4", "code-mode host exited during handshake with status 4"),
        ("garbage", "05000000c1c1c1c1c1", "failed to read code-mode host message"),
        ("garbage", "ffffffff", "failed to read code-mode host message"),
        ("garbage", "00000000", "failed to read code-mode host message"),
    ],
)
async def test_a_host_that_fails_its_handshake(
    tmp_path: Path, mode: str, argument: str, reason: str
) -> None:
    command = fake_command(tmp_path, mode, argument)
    with trio.fail_after(BOUND):
        async with codemode.open_process_provider(
            command, handshake_timeout=HANDSHAKE_TIMEOUT
        ) as provider:
            with pytest.raises(HostLostError) as lost:
                await provider.create_session()
            assert str(lost.value).startswith(reason), lost.value
            # The next operation starts a new host (the real one) and works.
            await _recovers(await provider.create_session())


FUZZ = settings(
    max_examples=int(os.environ.get("CODEMODE_FUZZ_EXAMPLES", "60")),
    deadline=None,
    database=None,
    derandomize="CODEMODE_FUZZ_EXAMPLES" not in os.environ,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@FUZZ
@given(garbage=st.binary(min_size=1, max_size=48))
async def test_garbage_instead_of_a_handshake_is_a_clear_error(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch, garbage: bytes
) -> None:
    FIGURES["garbage examples"] += 1
    # The host reads the hello, writes the garbage, closes its output and reads until its
    # input ends, as `fake_host.py garbage` does.
    with trio.fail_after(BOUND):
        async with (
            memory_hosts(monkeypatch, writes(garbage)) as hosts,
            codemode.open_process_provider(handshake_timeout=HANDSHAKE_TIMEOUT) as provider,
        ):
            with pytest.raises(HostLostError) as lost:
                await provider.create_session()
    text = str(lost.value)
    assert text.startswith(REASONS), text
    reason = next(reason for reason in REASONS if text.startswith(reason))
    FIGURES[reason] = FIGURES.get(reason, 0) + 1
    (host,) = hosts.spawned
    assert host.exited.is_set()


BROKEN_AFTER = 4
"""Frames the proxy passes before it breaks: ready, session ready, execution started and the
cell's tool call, so that a cell and a tool call are in flight."""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("garbage-after", "failed to read code-mode host message"),
        ("exit-after", "code-mode host exited with status 7"),
    ],
)
async def test_a_host_that_breaks_with_a_cell_in_flight(
    tmp_path: Path, mode: str, reason: str
) -> None:
    command = fake_command(tmp_path, mode, str(BROKEN_AFTER))
    delegate = RecordingDelegate()
    delegate.hold_tools = True
    with trio.fail_after(BOUND):
        async with codemode.open_process_provider(command) as provider:
            session = await provider.create_session()
            started = await execute(
                session, delegate, "text(await tools.slow({}))", tools=[tool("slow")]
            )
            with pytest.raises(HostLostError) as lost:
                await started.initial_response()
            assert str(lost.value).startswith(reason), lost.value
            await delegate.until(lambda: delegate.closed == [started.cell_id])
            assert delegate.cancelled_tools == ["tool-1"]
            # The session's next operation reopens it on a new host (its next generation).
            again = await execute(session, RecordingDelegate(), "text('recovered')")
            assert again.cell_id == "g2:1"
            response = await again.initial_response()
            assert texts(response) == ["recovered"]
        assert delegate.closed == [started.cell_id]


def test_client_fuzz_figures() -> None:
    """What the garbage fuzz above did (run after it, in file order): as many examples as it is
    set to run, each ending with one of the expected texts. (The suite's fixed sequence ends
    every one with `failed to read`; `nox -s fuzz` prints how its random ones ended.)"""
    print(f"client fuzz: {FIGURES}")
    examples = FIGURES["garbage examples"]
    if examples == 0:
        pytest.skip("the garbage fuzz did not run in this session")
    assert examples >= (FUZZ.max_examples or 0), FIGURES
    reached = {reason: count for reason, count in FIGURES.items() if reason in REASONS}
    assert sum(reached.values()) == examples, FIGURES
