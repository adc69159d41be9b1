"""The process provider: sessions served by a `codemode-host` child process over the wire."""

from typing import Any

from .._providers import HostLoad as HostLoad
from .._providers import ProviderStatistics as ProviderStatistics
from ._host_process import default_host_command as default_host_command
from ._provider import ProcessProvider as ProcessProvider
from ._provider import open_process_provider as open_process_provider

__all__ = [
    "HostLoad",
    "ProcessProvider",
    "ProviderStatistics",
    "default_host_command",
    "open_process_provider",
]


def __getattr__(name: str) -> Any:
    if name == "ProcessSession":
        from .._deprecated import session_alias

        return session_alias(__name__, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
