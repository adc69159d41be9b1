"""The process provider: sessions served by a `codemode-host` child process over the wire."""

from .._wire import ProcessSession as ProcessSession
from ._host_process import default_host_command as default_host_command
from ._pool import HostLoad as HostLoad
from ._pool import ProviderStatistics as ProviderStatistics
from ._provider import ProcessProvider as ProcessProvider
from ._provider import open_process_provider as open_process_provider

__all__ = [
    "HostLoad",
    "ProcessProvider",
    "ProcessSession",
    "ProviderStatistics",
    "default_host_command",
    "open_process_provider",
]
