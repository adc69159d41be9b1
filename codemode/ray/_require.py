"""The one check that the optional Ray package is installed.

Rule: every entry into `codemode.ray` goes through `require_ray`, so a missing extra is always
the same one-line `ImportError` (as `codemode.mcp._sdk` does for the MCP SDK).
"""

from __future__ import annotations

import importlib.util

MISSING_RAY = "codemode.ray needs Ray: pip install 'codemode[ray]'"


def require_ray() -> None:
    """Check that `ray` can be imported.

    Raises:
        ImportError: `MISSING_RAY`, naming the extra to install.
    """
    try:
        found = importlib.util.find_spec("ray") is not None
    except ValueError:  # a module set to None in sys.modules: blocked on purpose
        found = False
    if not found:
        raise ImportError(MISSING_RAY, name="ray")
