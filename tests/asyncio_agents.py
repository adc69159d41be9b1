"""What the agent-framework tests share: the cell that calls two tools across a yield, and
running an asyncio test body from a synchronous pytest test, bounded."""

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


def run_on_asyncio(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run `main` on a fresh asyncio loop, failing past 30 s."""

    async def bounded() -> None:
        async with asyncio.timeout(30):
            await main()

    asyncio.run(bounded())
