"""The abort path (rule 4 of `runtime/_cell.py`): a session's nursery cancelled under its cells,
without a shutdown first. Every cell closes, whatever its state: its `cell_closed` runs exactly
once, its delegate calls are cancelled, and no engine cell is left open (the `engine` fixture
checks that at the end)."""

from __future__ import annotations

import trio
import trio.testing
from codemode_host.engine import Engine
from codemode_host.runtime import RuntimeSession

from codemode import CellLimits
from tests.test_pending_frontier import holding, request


async def test_cancelling_a_sessions_nursery_closes_every_cell_exactly_once(
    engine: Engine,
) -> None:
    delegate = holding()
    sources = [
        "await new Promise(() => {});",  # waiting for nothing
        'text("calling"); await tools.echo({});',  # its tool call held by the delegate
        'text("done");',  # completed, its completion never collected
        "while (true) {}",  # computing
    ]
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            runtime = RuntimeSession(engine, nursery, CellLimits())
            cells = [runtime.start(request(source), delegate) for source in sources]
            for cell in cells:
                cell.release_initial_observer()
            await delegate.until(lambda: len(delegate.invocations) == 1)
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    assert sorted(delegate.closed) == ["1", "2", "3", "4"]
    assert delegate.cancelled_tools == ["tool-1"]
    assert all(runtime.cell(cell.cell_id) is None for cell in cells)
