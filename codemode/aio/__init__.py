"""codemode for asyncio applications: the same providers, sessions and `CodeMode`, as asyncio
coroutines.

codemode runs on trio; here trio runs as a guest on the application's asyncio loop
(`trio.lowlevel.start_guest_run`, `_bridge`): one trio run per loop, started by the first
provider opened on it and ended after the last one closed, on the loop's own thread (trio keeps
its own thread for its I/O waits). The application's delegates are asyncio objects: their async
methods, a `Toolbox`'s async tools among them, run as asyncio tasks on the loop; cancelling the
asyncio task that awaits an operation cancels that operation and releases what it held, as on
trio (`_session`).

```python
async with codemode.aio.open_process_provider() as provider:
    session = await provider.create_session()
    code_mode = codemode.aio.CodeMode(session, toolbox, toolbox.definitions())
    output = await code_mode.call("exec", "call-1", "text(await tools.list_cities())")
```
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, ParamSpec

import codemode

from ._bridge import BridgeClosedError as BridgeClosedError
from ._bridge import open_bridge
from ._code_mode import CodeMode as CodeMode
from ._session import Provider as Provider
from ._session import Session as Session
from ._session import StartedCell as StartedCell

__all__ = [
    "BridgeClosedError",
    "CodeMode",
    "Provider",
    "Session",
    "StartedCell",
    "open_in_process_provider",
    "open_process_provider",
    "open_remote_provider",
]

P = ParamSpec("P")


def _on_asyncio(
    opener: Callable[P, AbstractAsyncContextManager[Any]],
) -> Callable[P, AbstractAsyncContextManager[Provider]]:
    @asynccontextmanager
    async def open_provider(*args: P.args, **kwargs: P.kwargs) -> AsyncIterator[Provider]:
        async with (
            open_bridge() as bridge,
            bridge.hold(lambda: opener(*args, **kwargs)) as provider,
        ):
            yield Provider(provider, bridge)

    functools.update_wrapper(open_provider, opener)
    open_provider.__doc__ = (
        f"`codemode.{opener.__name__}`, for an asyncio application (same arguments): an async"
        " context manager giving a `codemode.aio.Provider`."
    )
    return open_provider


open_in_process_provider = _on_asyncio(codemode.open_in_process_provider)
open_process_provider = _on_asyncio(codemode.open_process_provider)
open_remote_provider = _on_asyncio(codemode.open_remote_provider)
