"""The model-facing layer: the exec and wait tools, their descriptions and their output.

What an agent developer wires to a model (DESIGN section 5, reference sections 7 and 8):
`CodeMode` binds a session, a delegate and the nested tools and runs the model's `exec` and
`wait` calls; the functions below work without a session (the `codemode describe` command uses
them). The modules behind this front door are private.
"""

from ._pragma import ExecSource as ExecSource
from ._pragma import PragmaError as PragmaError
from ._pragma import parse_exec_source as parse_exec_source
from ._truncation import approx_token_count as approx_token_count
from ._truncation import truncate_items as truncate_items
from ._truncation import truncate_middle as truncate_middle

__all__ = [
    "ExecSource",
    "PragmaError",
    "approx_token_count",
    "parse_exec_source",
    "truncate_items",
    "truncate_middle",
]
