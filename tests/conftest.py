"""Fixtures shared by the test suite."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from codemode_host.engine import Engine, open_engine


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    """A real engine (native workers and collector) for one test; no cell may outlive it."""
    async with open_engine() as engine:
        yield engine
        assert engine.live_cells == 0, "a test left a cell open"
