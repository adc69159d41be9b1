"""codemode: a trio-native code-mode runtime for LLM agents.

The public API (design.md, design 4). Everything is re-exported here; the modules behind it are
private.
"""

from typing import TYPE_CHECKING

from ._api import DEFAULT_HEAP_SIZE_BYTES as DEFAULT_HEAP_SIZE_BYTES
from ._api import DEFAULT_PENDING_OUTPUT_BYTES as DEFAULT_PENDING_OUTPUT_BYTES
from ._api import DEFAULT_STORED_VALUE_BYTES as DEFAULT_STORED_VALUE_BYTES
from ._api import MAX_PENDING_OUTPUT_BYTES as MAX_PENDING_OUTPUT_BYTES
from ._api import AdmissionLimits as AdmissionLimits
from ._api import CellId as CellId
from ._api import CellInfo as CellInfo
from ._api import CellLimits as CellLimits
from ._api import Completed as Completed
from ._api import ContentItem as ContentItem
from ._api import ExecuteRequest as ExecuteRequest
from ._api import ImageDetail as ImageDetail
from ._api import InputImage as InputImage
from ._api import InputText as InputText
from ._api import JsonValue as JsonValue
from ._api import LiveCell as LiveCell
from ._api import MissingCell as MissingCell
from ._api import NestedToolCall as NestedToolCall
from ._api import Pending as Pending
from ._api import RuntimeResponse as RuntimeResponse
from ._api import Session as Session
from ._api import SessionDelegate as SessionDelegate
from ._api import SessionUsage as SessionUsage
from ._api import StartedCell as StartedCell
from ._api import Terminated as Terminated
from ._api import ToolDefinition as ToolDefinition
from ._api import ToolKind as ToolKind
from ._api import ToolName as ToolName
from ._api import ToolThreadLimits as ToolThreadLimits
from ._api import ToolThreadStatistics as ToolThreadStatistics
from ._api import WaitOutcome as WaitOutcome
from ._api import WaitRequest as WaitRequest
from ._api import Yielded as Yielded
from ._api import missing_cell as missing_cell
from ._identifiers import normalize_identifier as normalize_identifier
from ._providers import HostLoad as HostLoad
from ._providers import Provider as Provider
from ._providers import ProviderStatistics as ProviderStatistics
from .errors import AdmissionError as AdmissionError
from .errors import AlreadyTerminatingError as AlreadyTerminatingError
from .errors import CodeModeError as CodeModeError
from .errors import FrameLimitError as FrameLimitError
from .errors import HostLostError as HostLostError
from .errors import InvalidRequestError as InvalidRequestError
from .errors import ObserverBusyError as ObserverBusyError
from .errors import ProviderClosedError as ProviderClosedError
from .errors import RuntimeEndedError as RuntimeEndedError
from .errors import RuntimeReplacedError as RuntimeReplacedError
from .errors import SessionShuttingDownError as SessionShuttingDownError
from .errors import StaleGenerationError as StaleGenerationError
from .errors import ToolDeniedError as ToolDeniedError
from .errors import ToolError as ToolError
from .errors import UnsupportedPlatformError as UnsupportedPlatformError
from .protocol import MAX_FRAME_BYTES as MAX_FRAME_BYTES

__all__ = [
    "DEFAULT_HEAP_SIZE_BYTES",
    "DEFAULT_PENDING_OUTPUT_BYTES",
    "DEFAULT_STORED_VALUE_BYTES",
    "MAX_FRAME_BYTES",
    "MAX_PENDING_OUTPUT_BYTES",
    "AdmissionError",
    "AdmissionLimits",
    "Allow",
    "AlreadyTerminatingError",
    "ApprovalRequest",
    "Approve",
    "Ask",
    "CellId",
    "CellInfo",
    "CellLimits",
    "CodeMode",
    "CodeModeError",
    "Completed",
    "ContentItem",
    "DefaultPolicy",
    "Deny",
    "ExecSource",
    "ExecuteRequest",
    "FrameLimitError",
    "GovernedTools",
    "HostLoad",
    "HostLostError",
    "ImageDetail",
    "InputImage",
    "InputText",
    "InvalidRequestError",
    "JournalEntry",
    "JsonValue",
    "LiveCell",
    "MissingCell",
    "NamespaceDescription",
    "NestedToolCall",
    "ObserverBusyError",
    "Pending",
    "PolicyBase",
    "PragmaError",
    "Provider",
    "ProviderClosedError",
    "ProviderStatistics",
    "RuntimeEndedError",
    "RuntimeReplacedError",
    "RuntimeResponse",
    "Session",
    "SessionDelegate",
    "SessionShuttingDownError",
    "SessionUsage",
    "StaleGenerationError",
    "StartedCell",
    "Terminated",
    "ToolDefinition",
    "ToolDeniedError",
    "ToolError",
    "ToolKind",
    "ToolName",
    "ToolOutput",
    "ToolPolicy",
    "ToolThreadLimits",
    "ToolThreadStatistics",
    "Toolbox",
    "UnsupportedPlatformError",
    "WaitOutcome",
    "WaitRequest",
    "Yielded",
    "combine",
    "default_host_command",
    "governed",
    "missing_cell",
    "normalize_identifier",
    "open_in_process_provider",
    "open_process_provider",
    "open_remote_provider",
    "parse_exec_source",
    "render_typescript",
    "truncate_items",
    "truncate_middle",
]


if TYPE_CHECKING:
    from ._combine import combine as combine
    from ._governance import Allow as Allow
    from ._governance import ApprovalRequest as ApprovalRequest
    from ._governance import Approve as Approve
    from ._governance import Ask as Ask
    from ._governance import DefaultPolicy as DefaultPolicy
    from ._governance import Deny as Deny
    from ._governance import GovernedTools as GovernedTools
    from ._governance import JournalEntry as JournalEntry
    from ._governance import PolicyBase as PolicyBase
    from ._governance import ToolPolicy as ToolPolicy
    from ._governance import governed as governed
    from ._toolbox import Toolbox as Toolbox
    from .inprocess import open_in_process_provider as open_in_process_provider
    from .model import CodeMode as CodeMode
    from .model import ExecSource as ExecSource
    from .model import NamespaceDescription as NamespaceDescription
    from .model import PragmaError as PragmaError
    from .model import ToolOutput as ToolOutput
    from .model import parse_exec_source as parse_exec_source
    from .model import render_typescript as render_typescript
    from .model import truncate_items as truncate_items
    from .model import truncate_middle as truncate_middle
    from .process import default_host_command as default_host_command
    from .process import open_process_provider as open_process_provider
    from .remote import open_remote_provider as open_remote_provider

# Imported on first use, so that `import codemode` stays cheap for the host, which loads the
# front door at every start (the providers also load trio and, in-process, the C extension;
# `import codemode.protocol` stays sans-IO).
_LAZY = {
    "combine": "._combine",
    "Allow": "._governance",
    "ApprovalRequest": "._governance",
    "Approve": "._governance",
    "Ask": "._governance",
    "DefaultPolicy": "._governance",
    "Deny": "._governance",
    "GovernedTools": "._governance",
    "JournalEntry": "._governance",
    "PolicyBase": "._governance",
    "ToolPolicy": "._governance",
    "governed": "._governance",
    "Toolbox": "._toolbox",
    "open_in_process_provider": ".inprocess",
    "open_process_provider": ".process",
    "default_host_command": ".process",
    "open_remote_provider": ".remote",
    **dict.fromkeys(
        [
            "CodeMode",
            "ExecSource",
            "NamespaceDescription",
            "PragmaError",
            "ToolOutput",
            "parse_exec_source",
            "render_typescript",
            "truncate_items",
            "truncate_middle",
        ],
        ".model",
    ),
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'codemode' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
