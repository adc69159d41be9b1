"""What the agent-framework tests share: the cell that calls two tools across a yield, what a
streamed run of it does when, and running an asyncio test body from a synchronous pytest test,
bounded."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

TWO_TOOLS = """\
const celsius = await tools.lookup({ city: "Lima" });
text(`celsius ${celsius}`);
yield_control();
text(`fahrenheit ${await tools.convert({ celsius })}`);
"""
"""A cell calling two tools, the second after a yield."""


def check_streamed_run(log: list[str]) -> None:
    """The order of a streamed run of `TWO_TOOLS`, from its log: the tools' calls, and
    `response streamed` after each model response's last chunk. The cell starts once `exec`'s
    call is complete (the whole response streamed), so its first tool call comes after it; it
    runs on after its yield, so its second call may come before or while the model streams its
    `wait` call; the answer streams after `wait`'s result, the cell complete."""
    assert log[:2] == ["response streamed", "lookup Lima"]
    assert sorted(log[2:4]) == ["convert 19.0", "response streamed"]
    assert log[4:] == ["response streamed"]


def run_on_asyncio(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run `main` on a fresh asyncio loop, failing past 30 s."""

    async def bounded() -> None:
        async with asyncio.timeout(30):
            await main()

    asyncio.run(bounded())
