"""Stored values that survive the loss of their host (`create_session(keep_stored_values=True)`,
docs/durability.md), on the process provider, a pool and the remote provider, with real hosts
killed with SIGKILL."""

from __future__ import annotations

import os
import signal

import pytest
import trio

import codemode
from codemode import ExecuteRequest, Provider
from codemode.errors import RUNTIME_REPLACED_KEPT, RuntimeReplacedError
from tests.delegates import RecordingDelegate
from tests.remote_hosts import listening_host

BOUND = 60


async def _run(session: codemode.Session, source: str) -> codemode.Completed:
    started = await session.execute(
        ExecuteRequest(tool_call_id="c", source=source), RecordingDelegate()
    )
    response = await started.initial_response()
    assert isinstance(response, codemode.Completed), response
    return response


def _texts(response: codemode.Completed) -> list[str]:
    return [i.text for i in response.content_items if isinstance(i, codemode.InputText)]


def _kill_host_of(provider: Provider) -> None:
    for host in provider.statistics().hosts:
        if host.sessions and host.pid is not None:
            os.kill(host.pid, signal.SIGKILL)
            return
    raise AssertionError("no host holds a session")


async def _after_the_loss(session: codemode.Session, source: str) -> codemode.Completed:
    """Run a cell after the host died: the operation that finds the loss fails
    (`HostLostError`, or `RuntimeReplacedError` where the session announces it), the next runs
    on the next generation."""
    try:
        return await _run(session, source)
    except codemode.HostLostError:
        return await _run(session, source)


async def _survives_a_lost_host(provider: Provider, kill: object, *, plain_lost: bool) -> None:
    kept = await provider.create_session(keep_stored_values=True)
    plain = await provider.create_session()
    await _run(kept, 'store("count", 1); store("name", "ada");')
    await _run(kept, 'store("count", load("count") + 1);')
    await _run(plain, 'store("count", 41);')
    # A terminated cell's writes are never committed, so never kept.
    held = await kept.execute(
        ExecuteRequest(tool_call_id="c", source='store("count", 99); await new Promise(() => {})'),
        RecordingDelegate(),
        observe_initial=False,
    )
    await kept.terminate(held.cell_id)
    assert callable(kill)
    await kill()
    with pytest.raises(codemode.HostLostError) as lost:
        await _run(kept, "text(1)")
    if not isinstance(lost.value, RuntimeReplacedError):  # it found the loss: the next re-opens
        with pytest.raises(RuntimeReplacedError) as lost:
            await _run(kept, "text(1)")
    assert str(lost.value) == RUNTIME_REPLACED_KEPT
    again = await _run(kept, 'text(JSON.stringify([load("count"), load("name")]))')
    assert _texts(again) == ['[2,"ada"]']
    if plain_lost:
        # The session that did not ask keeps the provider's own rule: its values are gone.
        gone = await _after_the_loss(plain, 'text(String(load("count")))')
        assert _texts(gone) == ["undefined"]


@pytest.mark.slow
@pytest.mark.parametrize("hosts", [1, 2], ids=["process", "pool"])
async def test_kept_values_survive_a_killed_host_process(hosts: int) -> None:
    with trio.fail_after(BOUND):
        async with codemode.open_process_provider(hosts=hosts) as provider:

            async def kill() -> None:
                for host in provider.statistics().hosts:
                    if host.pid is not None:
                        os.kill(host.pid, signal.SIGKILL)

            await _survives_a_lost_host(provider, kill, plain_lost=True)


@pytest.mark.slow
async def test_kept_values_survive_a_lost_listening_host() -> None:
    with trio.fail_after(BOUND):
        async with listening_host() as first, listening_host() as second:
            addresses = [first.address, second.address]
            async with codemode.open_remote_provider(addresses) as provider:

                async def kill() -> None:
                    # The kept session went to the first host (the lowest index of the least
                    # loaded), the other session to the second, which lives on.
                    await first.stop(signal.SIGKILL)

                await _survives_a_lost_host(provider, kill, plain_lost=False)


async def test_in_process_sessions_accept_the_option() -> None:
    with trio.fail_after(BOUND):
        async with codemode.open_in_process_provider() as provider:
            session = await provider.create_session(keep_stored_values=True)
            await _run(session, 'store("k", 1)')
            assert _texts(await _run(session, 'text(String(load("k")))')) == ["1"]


@pytest.mark.slow
async def test_a_host_without_the_capability_is_refused_the_option() -> None:
    import sys
    from pathlib import Path

    from codemode.protocol import KEPT_VALUES_CAPABILITY

    limited = [sys.executable, str(Path(__file__).with_name("limited_host.py"))]
    with trio.fail_after(BOUND):
        async with codemode.open_process_provider(host_command=limited) as provider:
            with pytest.raises(codemode.InvalidRequestError) as refused:
                await provider.create_session(keep_stored_values=True)
            plain = await provider.create_session()  # the host serves the others as before
            await _run(plain, 'store("k", 1)')
    assert str(refused.value) == (
        "code-mode host does not support kept stored values: missing"
        f" `{KEPT_VALUES_CAPABILITY}` capability"
    )


def test_a_host_refuses_kept_values_it_did_not_negotiate() -> None:
    from codemode.errors import ErrorKind
    from codemode.protocol import LIMITS_CAPABILITY, Answered, Err, RequestReceived
    from tests.protocol_pair import Pair

    pair = Pair(capabilities=(LIMITS_CAPABILITY,))
    pair.handshake()
    request_id = pair.client.open_session("s", None, keep_stored_values=True)
    assert not [event for event in pair.to_host() if isinstance(event, RequestReceived)]
    refusal = Err(
        kind=ErrorKind.INVALID_REQUEST,
        message="code-mode kept stored values need the `kept-stored-values` capability",
    )
    assert Answered(request_id=request_id, result=refusal) in pair.to_client()
