"""Public names that went away and stay importable for a while: each use warns.

`codemode.process.ProcessSession` and `codemode.remote.RemoteSession` were the session classes
of those providers; every provider whose cells run in a host now has the same one
(`codemode._wire.WireSession`), and code types its sessions as `codemode.Session`.
"""

from __future__ import annotations

import warnings


def session_alias(module: str, name: str) -> type:
    """The session class `module.name` named, with a `DeprecationWarning` for its user."""
    warnings.warn(
        f"{module}.{name} is deprecated: a provider's sessions are `codemode.Session`s",
        DeprecationWarning,
        stacklevel=3,  # the code that named it, past the module's `__getattr__`
    )
    from ._wire import WireSession

    return WireSession
