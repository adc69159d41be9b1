"""The model-facing layer: the exec and wait tools, their descriptions and their output.

What an agent developer wires to a model (design.md, design 5, design.md, runtime 7 and 8):
`CodeMode` binds a session, a delegate and the nested tools and runs the model's `exec` and
`wait` calls; the functions below work without a session (the `codemode describe` command uses
them). The modules behind this front door are private.

`CodeMode` is imported on first use: it needs trio, and `import codemode` (which the host and the
sans-IO protocol package go through) must not load it.
"""

from typing import TYPE_CHECKING

from ._arguments import ArgumentsError as ArgumentsError
from ._arguments import WaitArguments as WaitArguments
from ._descriptions import NamespaceDescription as NamespaceDescription
from ._descriptions import augment_tool_definition as augment_tool_definition
from ._descriptions import exec_description as exec_description
from ._descriptions import tool_declaration as tool_declaration
from ._descriptions import wait_description as wait_description
from ._images import IMAGE_OMITTED as IMAGE_OMITTED
from ._mcp_types import MCP_TYPES as MCP_TYPES
from ._nested_payload import nested_tool_payload as nested_tool_payload
from ._output import DEFAULT_MAX_TOKENS as DEFAULT_MAX_TOKENS
from ._output import ToolOutput as ToolOutput
from ._pragma import ExecSource as ExecSource
from ._pragma import PragmaError as PragmaError
from ._pragma import parse_exec_source as parse_exec_source
from ._specs import EXEC_GRAMMAR as EXEC_GRAMMAR
from ._specs import WAIT_PARAMETERS as WAIT_PARAMETERS
from ._specs import ModelApi as ModelApi
from ._specs import tool_specs as tool_specs
from ._truncation import approx_token_count as approx_token_count
from ._truncation import truncate_items as truncate_items
from ._truncation import truncate_middle as truncate_middle
from ._typescript import render_typescript as render_typescript

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "EXEC_GRAMMAR",
    "IMAGE_OMITTED",
    "MCP_TYPES",
    "WAIT_PARAMETERS",
    "ArgumentsError",
    "CodeMode",
    "ExecSource",
    "ModelApi",
    "NamespaceDescription",
    "PragmaError",
    "ToolOutput",
    "WaitArguments",
    "approx_token_count",
    "augment_tool_definition",
    "exec_description",
    "nested_tool_payload",
    "parse_exec_source",
    "render_typescript",
    "tool_declaration",
    "tool_specs",
    "truncate_items",
    "truncate_middle",
    "wait_description",
]


if TYPE_CHECKING:
    from ._code_mode import CodeMode as CodeMode


def __getattr__(name: str) -> object:
    if name == "CodeMode":
        from ._code_mode import CodeMode

        return CodeMode
    raise AttributeError(f"module 'codemode.model' has no attribute {name!r}")
