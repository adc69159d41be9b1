"""`codemode.ray`: host actors placed by a local Ray instance, sessions through them.

Ray starts once for the module (`ray_cluster`), bound to loopback, without a dashboard and
without usage statistics; every test starts its own two host actors. Processes are followed
by pid file descriptors (`wait_readable` on a pidfd: readable once the process exited), never
by sleeping.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
from collections.abc import Iterator
from contextlib import AsyncExitStack
from functools import partial
from typing import Any

import pytest
import trio

# Read when Ray is imported, and inherited by the processes `ray.init` starts. Ray replaces a
# loopback `_node_ip_address` by the machine's reachable address unless clusters are off
# (`ray._private.services.get_node_ip_address`, `ray_constants.ENABLE_RAY_CLUSTER`): off,
# Ray's traffic and the hosts' addresses stay on 127.0.0.1.
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

import ray

from codemode import HostLostError, Provider, ProviderStatistics, RuntimeReplacedError
from codemode.ray import open_ray_provider
from tests.delegates import RecordingDelegate
from tests.helpers import wait_exited
from tests.sessions import execute, run, texts

# A Ray cluster and its host actors; under pytest-xdist, one cluster in one worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]

TOKEN = "ray-test-token-4f1c"


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    # Ray's session directory holds its Unix sockets, whose paths must stay under 108 bytes:
    # under nox, $TMPDIR is deep inside the project and `ray.init` waited forever.
    with tempfile.TemporaryDirectory(prefix="ray-", dir="/tmp") as session_root:
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            _temp_dir=session_root,
            log_to_driver=False,
            configure_logging=False,
            namespace="codemode-tests",
        )
        try:
            yield
        finally:
            ray.shutdown()


async def _ray(function: Any, *args: Any, **kwargs: Any) -> Any:
    return await trio.to_thread.run_sync(partial(function, *args, **kwargs))


async def _pids(actor: Any) -> tuple[int, int]:
    """The actor's process id and its host's."""
    pids: tuple[int, int] = await _ray(ray.get, actor.pids.remote(), timeout=30)
    return pids


def _command_line(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as file:
        return [part.decode() for part in file.read().split(b"\0") if part]


@pytest.mark.usefixtures("ray_cluster")
async def test_sessions_spread_over_the_host_actors_and_run_cells() -> None:
    with trio.fail_after(120):
        async with open_ray_provider(2, token=TOKEN) as provider:
            first, second = provider.addresses
            assert first != second
            assert all(address.startswith("tcp://127.0.0.1:") for address in (first, second))
            sessions = [await provider.create_session() for _ in range(4)]
            assert provider.placement() == {first: 2, second: 2}
            for index, session in enumerate(sessions):
                response = await run(session, RecordingDelegate(), f"text({index} * 2)")
                assert texts(response) == [str(index * 2)]
            # The token went to each host in its environment, never on its command line.
            for actor in provider.actors:
                _, host = await _pids(actor)
                command = _command_line(host)
                assert "--listen" in command
                assert not any(TOKEN in part for part in command)


@pytest.mark.usefixtures("ray_cluster")
async def test_a_killed_actors_sessions_recover_on_a_restarted_host() -> None:
    with trio.fail_after(120):
        async with open_ray_provider(2, token=TOKEN, connect_timeout=60) as provider:
            killed, kept = provider.actors
            old_address = provider.addresses[0]
            delegates = [RecordingDelegate(), RecordingDelegate()]
            affected, other = [await provider.create_session() for _ in range(2)]
            assert provider.placement() == dict.fromkeys(provider.addresses, 1)
            for session, delegate in zip((affected, other), delegates, strict=True):
                started = await execute(session, delegate, "await new Promise(() => {})",
                                        yield_time_ms=0)  # fmt: skip
                await started.initial_response()
            actor_pid, host_pid = await _pids(killed)

            await _ray(ray.kill, killed, no_restart=False)
            await wait_exited(actor_pid)
            await wait_exited(host_pid)  # it stops once its actor is gone
            await delegates[0].until(lambda: "1" in delegates[0].closed)

            # The affected session: replaced once, then it runs on the restarted host.
            with pytest.raises(RuntimeReplacedError):
                await run(affected, delegates[0], "text('lost')")
            response = await run(affected, delegates[0], "text('back')")
            assert (response.cell_id, texts(response)) == ("g2:1", ["back"])
            new_address = provider.addresses[0]
            assert new_address != old_address
            assert (await _pids(killed))[0] != actor_pid
            assert provider.placement() == {new_address: 1, provider.addresses[1]: 1}

            # The other session never noticed: its cell still runs, its next one is "2".
            assert delegates[1].closed == []
            response = await run(other, delegates[1], "text('untouched')")
            assert (response.cell_id, texts(response)) == ("2", ["untouched"])
            assert kept is provider.actors[1]


@pytest.mark.usefixtures("ray_cluster")
async def test_a_crashed_host_takes_its_actor_down_and_ray_restarts_both() -> None:
    with trio.fail_after(120):
        async with open_ray_provider(1, connect_timeout=60) as provider:
            (actor,) = provider.actors
            session = await provider.create_session()
            delegate = RecordingDelegate()
            started = await execute(session, delegate, "await new Promise(() => {})",
                                    yield_time_ms=0)  # fmt: skip
            await started.initial_response()
            actor_pid, host_pid = await _pids(actor)
            os.kill(host_pid, signal.SIGKILL)
            await wait_exited(actor_pid)  # the actor ended itself, for Ray to restart it
            await delegate.until(lambda: "1" in delegate.closed)
            with pytest.raises(RuntimeReplacedError):
                await run(session, delegate, "text('lost')")
            response = await run(session, delegate, "text('back')")
            assert (response.cell_id, texts(response)) == ("g2:1", ["back"])
            assert (await _pids(actor))[0] != actor_pid


@pytest.mark.usefixtures("ray_cluster")
async def test_leaving_the_block_stops_every_host_and_actor() -> None:
    with trio.fail_after(120):
        async with open_ray_provider(2) as provider:
            pids = [await _pids(actor) for actor in provider.actors]
            session = await provider.create_session()
            started = await execute(session, RecordingDelegate(), "await new Promise(() => {})",
                                    yield_time_ms=0)  # fmt: skip
            await started.initial_response()
            for _, host in pids:
                assert "codemode_host" in " ".join(_command_line(host))
        # The hosts were stopped and reaped before the block ended.
        for _, host in pids:
            with pytest.raises(ProcessLookupError):
                os.pidfd_open(host)
        # The actors' processes end once Ray killed them.
        for actor, _ in pids:
            await wait_exited(actor)


@pytest.mark.usefixtures("ray_cluster")
async def test_a_host_that_refuses_to_listen_fails_the_start() -> None:
    # Beyond loopback without a token: the host refuses to start, and says why.
    with trio.fail_after(120), pytest.raises(HostLostError) as caught:
        async with open_ray_provider(1, listen_host="192.0.2.254", max_restarts=0):
            pass  # pragma: no cover
    assert "a code-mode host actor did not start" in str(caught.value)
    assert "refusing to listen on tcp://192.0.2.254:0 without a token" in str(caught.value)


async def test_the_host_count_is_hosts_and_num_hosts_its_deprecated_alias() -> None:
    # Checked before Ray is asked anything: no cluster needed.
    with pytest.raises(TypeError, match="hosts or num_hosts, not both"):
        async with open_ray_provider(1, num_hosts=1):
            pass  # pragma: no cover
    with pytest.raises(TypeError, match="needs hosts"):
        async with open_ray_provider():
            pass  # pragma: no cover
    with (
        pytest.warns(DeprecationWarning, match=r"num_hosts=\.\.\.\) is deprecated") as warned,
        pytest.raises(ValueError, match="at least one host"),
    ):
        async with open_ray_provider(num_hosts=0):
            pass  # pragma: no cover
    assert [warning.filename for warning in warned] == [__file__]  # the caller's line


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
async def test_a_ray_provider_is_a_provider_with_the_same_statistics() -> None:
    with trio.fail_after(120):
        async with open_ray_provider(hosts=2) as provider:
            assert isinstance(provider, Provider)
            sessions = [await provider.create_session() for _ in range(3)]
            delegate = RecordingDelegate()
            started = await execute(sessions[0], delegate, "await new Promise(() => {})",
                                    yield_time_ms=0)  # fmt: skip
            await started.initial_response()
            statistics = provider.statistics()
            assert isinstance(statistics, ProviderStatistics)
            assert [host.address for host in statistics.hosts] == provider.addresses
            assert [host.sessions for host in statistics.hosts] == [2, 1]
            assert [host.cells for host in statistics.hosts] == [1, 0]
            assert (statistics.sessions, statistics.cells, statistics.spawned) == (3, 1, 2)
            assert statistics.tool_threads == provider.tool_thread_statistics()


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
async def test_num_hosts_still_starts_the_hosts_with_a_warning() -> None:
    with trio.fail_after(120):
        async with AsyncExitStack() as stack:
            with pytest.warns(DeprecationWarning, match="use hosts="):
                provider = await stack.enter_async_context(open_ray_provider(num_hosts=1))
            assert len(provider.actors) == 1
            response = await run(await provider.create_session(), RecordingDelegate(), "text(1)")
            assert texts(response) == ["1"]


def test_without_ray_the_import_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in sys.modules if name.startswith("codemode.ray")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(
        ImportError, match=r"^codemode.ray needs Ray: pip install 'codemode\[ray\]'$"
    ):
        import codemode.ray  # noqa: F401
