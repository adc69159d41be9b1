"""The remote provider: sessions served by hosts listening on sockets (`codemode-host --listen`).

`open_remote_provider(["tcp://HOST:PORT", "unix:PATH"], token=..., ssl_context=...)` places
each session on the least-loaded reachable host, over one connection per host; a lost
connection is a lost host, and each affected session's next operation reopens it on a fresh
connection and raises `RuntimeReplacedError` once (docs/scaling.md).
"""

from ._provider import RemoteProvider as RemoteProvider
from ._provider import open_remote_provider as open_remote_provider
from ._session import RemoteSession as RemoteSession

__all__ = ["RemoteProvider", "RemoteSession", "open_remote_provider"]
