"""The one check that the optional MCP SDK is installed.

Rule: every entry into `codemode.mcp` (the package import, `codemode mcp serve`) goes through
`require_sdk`, so a missing extra is always the same one-line `ImportError`.
"""

from __future__ import annotations

import importlib.util

MISSING_SDK = "codemode.mcp needs the MCP SDK: pip install 'codemode[mcp]'"


def require_sdk() -> None:
    """Check that `mcp` and `hypercorn` can be imported.

    Raises:
        ImportError: `MISSING_SDK`, naming the extra to install.
    """
    for name in ("mcp", "hypercorn"):
        try:
            found = importlib.util.find_spec(name) is not None
        except ValueError:  # a module set to None in sys.modules: blocked on purpose
            found = False
        if not found:
            raise ImportError(MISSING_SDK, name=name)
