"""The remote provider: sessions served by hosts listening on sockets (`codemode-host --listen`).

`open_remote_provider(["tcp://HOST:PORT", "unix:PATH"], token=..., ssl_context=...)` places
each session on the least-loaded reachable host, over one connection per host; a lost
connection is a lost host, and each affected session's next operation reopens it on a fresh
connection and raises `RuntimeReplacedError` once (docs/scaling.md).
"""

from typing import Any

from ._provider import RemoteProvider as RemoteProvider
from ._provider import open_remote_provider as open_remote_provider

__all__ = ["RemoteProvider", "open_remote_provider"]


def __getattr__(name: str) -> Any:
    if name == "RemoteSession":
        from .._deprecated import session_alias

        return session_alias(__name__, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
