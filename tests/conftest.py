"""Fixtures shared by the test suite."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

import pytest
from codemode_host.engine import Engine, open_engine

import codemode
from codemode import CellLimits, Session
from tests.delegates import RecordingDelegate


class Provider(Protocol):
    async def create_session(self, limits: CellLimits | None = None) -> Session: ...


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    """A real engine (native workers and collector) for one test; no cell may outlive it."""
    async with open_engine() as engine:
        yield engine
        assert engine.live_cells == 0, "a test left a cell open"


@pytest.fixture(params=["in-process"])
async def provider(request: pytest.FixtureRequest) -> AsyncIterator[Provider]:
    """Each provider kind in turn; a caller cannot tell them apart but for documented details."""
    assert request.param == "in-process"
    async with codemode.open_in_process_provider() as provider:
        yield provider


@pytest.fixture
async def session(provider: Provider) -> Session:
    return await provider.create_session()


@pytest.fixture
def delegate() -> RecordingDelegate:
    return RecordingDelegate()
