"""Memory after a burst of cells: an engine opened with `release_when_idle` (the host's)
collects Python's garbage and trims once idle; `Engine` rule 10's own trim is in
tests/test_engine.py."""

from __future__ import annotations

import gc

import pytest
import trio
from codemode_host.engine import RELEASE_AFTER_CELLS, open_engine

from tests.helpers import run_cell


async def test_trim_gives_memory_back_on_request() -> None:
    async with open_engine(workers=1) as engine:
        trims = engine.trims
        await trio.to_thread.run_sync(engine._native.trim)
        assert engine.trims == trims + 1


@pytest.mark.slow
async def test_an_idle_engine_collects_garbage_and_trims_after_a_burst_of_cells() -> None:
    # Automatic collections off: a full collection recorded is the engine's own.
    trims_at_collection: list[int] = []
    steps: list[str] = []

    def record(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 2:
            trims_at_collection.append(engine.trims)
            steps.append("collect")

    was_enabled = gc.isenabled()
    gc.disable()
    gc.callbacks.append(record)
    try:
        async with open_engine(workers=1, release_when_idle=True) as engine:
            engine.on_release(lambda: steps.append("drop"))
            with trio.fail_after(60):
                for _ in range(RELEASE_AFTER_CELLS):
                    run = await run_cell(engine, 'text("x")')
                    assert run.texts == ["x"]
                trims = engine.trims
                # Rule 10's own trim may come first: wait for the one after the collection.
                while not trims_at_collection or trims <= trims_at_collection[0]:
                    trims = await engine.wait_trimmed(trims, 10)
    finally:
        gc.callbacks.remove(record)
        if was_enabled:
            gc.enable()
    assert len(trims_at_collection) == 1
    assert steps == ["drop", "collect"]  # what the hook let go of is collected too
