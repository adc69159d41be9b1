"""MCP both ways: MCP servers' tools inside cells, and code mode served over MCP.

`open_mcp_toolbox` connects to MCP servers and serves their tools to cells as
`tools.mcp__<server>__<tool>`; `codemode mcp serve` (`serve_stdio`, `serve_http`) offers code
mode's `exec` and `wait` to MCP clients.

Needs the optional extra `codemode[mcp]` (the official `mcp` SDK and hypercorn). Importing this
package without it raises one `ImportError` whose text names the extra; `import codemode` never
imports this package.
"""

from ._sdk import require_sdk as _require_sdk

_require_sdk()

from ._connection import McpConnectionError as McpConnectionError  # noqa: E402
from ._servers import McpServer as McpServer  # noqa: E402
from ._servers import parse_server as parse_server  # noqa: E402
from ._servers import read_config as read_config  # noqa: E402
from ._toolbox import McpToolbox as McpToolbox  # noqa: E402
from ._toolbox import open_mcp_toolbox as open_mcp_toolbox  # noqa: E402

__all__ = [
    "McpConnectionError",
    "McpServer",
    "McpToolbox",
    "open_mcp_toolbox",
    "parse_server",
    "read_config",
]
