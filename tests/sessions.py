"""Small helpers for tests that drive sessions through the public API."""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable

import trio
import trio.testing

from codemode import (
    ContentItem,
    ExecuteRequest,
    InputText,
    LiveCell,
    MissingCell,
    Pending,
    RuntimeResponse,
    Session,
    SessionDelegate,
    StartedCell,
    ToolDefinition,
    ToolName,
    WaitOutcome,
)

LONG_MS = 60_000


def tool(name: str, description: str = "") -> ToolDefinition:
    return ToolDefinition(name=name, tool_name=ToolName.plain(name), description=description)


async def execute(
    session: Session,
    delegate: SessionDelegate,
    source: str,
    *,
    yield_time_ms: int | None = LONG_MS,
    tools: list[ToolDefinition] | None = None,
    call_id: str = "call-1",
    observe_initial: bool = True,
    idempotency_key: str | None = None,
) -> StartedCell:
    request = ExecuteRequest(
        tool_call_id=call_id,
        source=source,
        enabled_tools=tools or [],
        yield_time_ms=yield_time_ms,
    )
    if idempotency_key is None:  # as a Session without keys is called
        return await session.execute(request, delegate, observe_initial=observe_initial)
    return await session.execute(
        request, delegate, observe_initial=observe_initial, idempotency_key=idempotency_key
    )


async def run(
    session: Session,
    delegate: SessionDelegate,
    source: str,
    *,
    yield_time_ms: int | None = LONG_MS,
    tools: list[ToolDefinition] | None = None,
) -> RuntimeResponse:
    """Execute and return the initial response."""
    started = await execute(session, delegate, source, yield_time_ms=yield_time_ms, tools=tools)
    return await started.initial_response()


def texts(value: RuntimeResponse | Pending | WaitOutcome | list[ContentItem]) -> list[str]:
    """The texts of a response's (or an outcome's) content items."""
    if isinstance(value, LiveCell | MissingCell):
        value = value.response
    items = value if isinstance(value, list) else value.content_items
    return [item.text for item in items if isinstance(item, InputText)]


SETTLE: contextvars.ContextVar[Callable[[], Awaitable[None]] | None] = contextvars.ContextVar(
    "SETTLE", default=None
)
"""What `all_tasks_blocked` waits for instead of trio's own, where part of each session
operation runs outside trio: set by the asyncio flavour of the contract (tests/test_aio.py)."""


async def all_tasks_blocked() -> None:
    """Until every task is blocked, the session operations started so far among them: what the
    contract tests wait for before they act on an observation a task of theirs started.

    Under trio it is `trio.testing.wait_all_tasks_blocked`. In the asyncio flavour part of each
    operation runs as an asyncio task, which trio does not see (all trio tasks may be blocked
    while the operation is still on its way through asyncio): that flavour's `SETTLE` also
    waits until none of them is running."""
    settle = SETTLE.get()
    if settle is None:
        await trio.testing.wait_all_tasks_blocked()
    else:
        await settle()
